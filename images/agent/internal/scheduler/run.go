// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package scheduler

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
)

// Outcome indexes of modeMetrics.
const (
	outcomeSuccess = iota
	outcomeFailure
	outcomeError
	outcomeDeferred
	numOutcomes
)

// outcomeLabels are the outcome label values by index.
var outcomeLabels = [numOutcomes]string{metrics.OutcomeSuccess, metrics.OutcomeFailure, metrics.OutcomeError, metrics.OutcomeDeferred}

// modeMetrics are the per-run metrics of one probe mode, by outcome index.
type modeMetrics struct {
	results  [numOutcomes]prometheus.Counter
	duration [numOutcomes]prometheus.Observer
}

func newModeMetrics(m *metrics.Metrics, mode string) *modeMetrics {
	mm := &modeMetrics{}
	for i, outcome := range outcomeLabels {
		mm.results[i] = m.ProbeResults.WithLabelValues(mode, outcome)
		mm.duration[i] = m.ProbeDuration.WithLabelValues(mode, outcome)
	}
	return mm
}

type dueKey struct{}

// Due is when the run that ctx belongs to was due (the context a Runner is given); a run that
// started later than that waited for a worker.
func Due(ctx context.Context) (time.Time, bool) {
	t, ok := ctx.Value(dueKey{}).(time.Time)
	return t, ok
}

// runOne runs e on a worker: it starts the run (startLocked), runs the probe, counts it
// (countRun) and, unless the target went away meanwhile, applies the thresholds and schedules
// the next run (endLocked).
func (s *Scheduler) runOne(parent context.Context, e *entry) {
	s.mu.Lock()
	if e.gone || parent.Err() != nil {
		s.finishLocked(e)
		s.pokeLocked(nil)
		s.mu.Unlock()
		return
	}
	t := e.t
	start := s.opts.Clock.Now()
	runCtx, cancel, lateness, report := s.startLocked(parent, e, start)
	s.mu.Unlock()
	if report {
		s.opts.Logger.Info("probes start more than a period late", "resource", t.Key.Resource, "lateness", lateness.String(), "period", t.Period.String())
		s.opts.OnLate(t.Key.Resource, lateness)
	}

	out := s.opts.Runner.Run(runCtx, t)
	cancel()
	elapsed := s.opts.Clock.Since(start)
	out = s.countRun(t, out, elapsed)

	s.mu.Lock()
	s.finishLocked(e)
	e.cancel = nil
	if e.gone || parent.Err() != nil {
		s.pokeLocked(nil)
		s.mu.Unlock()
		return
	}
	changed := s.endLocked(e, out, start.Add(elapsed))
	res := e.result
	s.mu.Unlock()
	if changed {
		s.opts.Metrics.ProbeTransitions.WithLabelValues(string(t.Probe.Mode), res.State.String()).Inc()
		s.opts.Logger.V(1).Info("probe result changed", "resource", t.Key.Resource, "pod", t.PodName, "probe", t.Key.Probe, "state", res.State.String(), "reason", res.Reason)
		s.opts.OnChange(Change{Key: t.Key, Target: t, Result: res})
	}
}

// startLocked starts e's run at start: it measures how late the run is (and whether that is
// to be reported, lateLocked) and gives the run its context and cancel.
func (s *Scheduler) startLocked(parent context.Context, e *entry, start time.Time) (context.Context, context.CancelFunc, time.Duration, bool) {
	t := e.t
	lateness := max(start.Sub(e.due), 0)
	s.opts.Metrics.SchedulingLag.Observe(lateness.Seconds())
	// Late by more than a period: one run (at least) was missed. It is reported and counted;
	// the run itself counts as any other, so the agent's own lateness never decides a result.
	report := false
	if t.Period > 0 && lateness > t.Period {
		s.opts.Metrics.LateRuns.Inc()
		report = s.lateLocked(t.Key.Resource, start)
	}
	// One context per run: the due time, the scheduler's deadline and the cancel that removal
	// and Start's end use. The prober enforces timeoutSeconds; this deadline only guards against
	// a runner that does not. It derives from runBase, not from parent: see Scheduler.runBase.
	// Context deadlines are in real time, whatever the clock.
	deadline := time.Now().Add(time.Duration(t.Probe.TimeoutSeconds)*time.Second + time.Second)
	if d, ok := parent.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	runCtx, cancel := context.WithDeadline(context.WithValue(s.runBase, dueKey{}, e.due), deadline)
	e.cancel = cancel
	return runCtx, cancel, lateness, report
}

// countRun counts one run of t by its mode and outcome and returns out as the thresholds take
// it: a run that could not run is a failure with the error as its reason.
func (s *Scheduler) countRun(t Target, out Outcome, elapsed time.Duration) Outcome {
	outcome := outcomeFailure
	switch {
	case out.Deferred:
		outcome = outcomeDeferred
	case out.Err != nil:
		outcome = outcomeError
		out.Pass, out.Reason = false, "probe could not run: "+out.Err.Error()
	case out.Pass:
		outcome = outcomeSuccess
	}
	if mm := s.byMode[t.Probe.Mode]; mm != nil {
		mm.results[outcome].Inc()
		mm.duration[outcome].Observe(elapsed.Seconds())
	} else {
		mode := string(t.Probe.Mode)
		s.opts.Metrics.ProbeResults.WithLabelValues(mode, outcomeLabels[outcome]).Inc()
		s.opts.Metrics.ProbeDuration.WithLabelValues(mode, outcomeLabels[outcome]).Observe(elapsed.Seconds())
	}
	return out
}

// endLocked applies the thresholds to a run that ended at now (a deferred run counts for
// nothing) and queues e's next run; it tells whether e's result changed.
func (s *Scheduler) endLocked(e *entry, out Outcome, now time.Time) bool {
	changed := false
	if !out.Deferred {
		changed = e.record(out.Pass, out.Reason)
	}
	if changed {
		// The run that decided the result: the trigger time of the slice write it causes.
		e.result.At = now
	}
	// The next run is one period after this one was due, moved by the jitter; a run that
	// overran its slot is rescheduled from now.
	period := e.t.Period
	e.due = e.due.Add(period + s.jitter(period))
	if e.due.Before(now) {
		e.due = now.Add(s.jitter(period) + time.Duration(float64(period)*s.opts.Jitter))
	}
	s.queueLocked(e, inTimers)
	s.pokeLocked(e)
	return changed
}

// record applies the thresholds to one raw outcome and tells whether the result changed.
func (e *entry) record(pass bool, reason string) bool {
	if e.run > 0 && pass == e.last {
		e.run++
	} else {
		e.last, e.run = pass, 1
	}
	success := max(e.t.Probe.SuccessThreshold, 1)
	failure := max(e.t.Probe.FailureThreshold, 1)
	switch {
	case pass && int32(e.run) >= success && e.result.State != portrule.Pass:
		e.result = portrule.ProbeResult{State: portrule.Pass}
		return true
	case !pass && int32(e.run) >= failure && e.result.State != portrule.Fail:
		e.result = portrule.ProbeResult{State: portrule.Fail, Reason: reason}
		return true
	case !pass && e.result.State == portrule.Fail:
		e.result.Reason = reason
	}
	return false
}
