// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
)

var res = types.NamespacedName{Namespace: "ns", Name: "mail"}

func target(pod string, probe int, period time.Duration, success, failure int32) Target {
	p := v1alpha1.Probe{Mode: v1alpha1.ProbeModeTCP, TimeoutSeconds: 1, SuccessThreshold: success, FailureThreshold: failure,
		TCP: &v1alpha1.TCPProbe{TargetPort: intstr.FromInt32(2525)}}
	return Target{
		Key:   NewKey(res, types.UID(pod), probe, DigestProbe(p), "10.0.0.1", 2525, period),
		Probe: p, Namespace: "ns", PodName: pod, PodIP: "10.0.0.1", Port: 2525, Period: period,
	}
}

func TestRecordAppliesThresholdsWithHysteresis(t *testing.T) {
	tests := map[string]struct {
		success, failure int32
		runs             string // P = pass, F = fail
		want             string // the state after each run: U, P, F
		changes          int
	}{
		"one pass decides with successThreshold 1":                          {1, 3, "P", "P", 1},
		"failures below failureThreshold keep a passing target passing":     {1, 3, "PFFPFF", "PPPPPP", 1},
		"failureThreshold consecutive failures fail it":                     {1, 3, "PFFF", "PPPF", 2},
		"successThreshold consecutive passes bring it back":                 {2, 1, "FPFPP", "FFFFP", 2},
		"a new target stays undecided until a threshold is reached":         {2, 3, "PFFP", "UUUU", 0},
		"a new target that keeps failing is decided after failureThreshold": {1, 3, "FFF", "UUF", 1},
		"repeated results emit nothing more":                                {1, 1, "PPPPFFFF", "PPPPFFFF", 2},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := &entry{t: target("p", 0, time.Second, tc.success, tc.failure)}
			got, changes := "", 0
			for _, r := range tc.runs {
				if e.record(r == 'P', "refused") {
					changes++
				}
				got += map[portrule.State]string{portrule.Unknown: "U", portrule.Pass: "P", portrule.Fail: "F"}[e.result.State]
			}
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.changes, changes)
		})
	}
}

// harness starts a scheduler and stops it at the end of the test, then checks that no
// goroutine is left.
func harness(t *testing.T, opts Options) (*Scheduler, *metrics.Metrics) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	m := metrics.New(nil)
	opts.Metrics = m
	s := New(opts)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Start(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		goleak.VerifyNone(t, before)
	})
	return s, m
}

func TestResultsAreEmittedOnlyOnChange(t *testing.T) {
	var runs atomic.Int32
	var mu sync.Mutex
	var changes []Change
	s, m := harness(t, Options{
		Runner: RunnerFunc(func(context.Context, Target) Outcome { runs.Add(1); return Outcome{Pass: true} }),
		OnChange: func(c Change) {
			mu.Lock()
			defer mu.Unlock()
			changes = append(changes, c)
		},
		MaxStartSpread: time.Millisecond,
	})
	tg := target("p1", 0, 10*time.Millisecond, 1, 3)
	s.Set(res, []Target{tg})
	require.Eventually(t, func() bool { return runs.Load() >= 10 }, 10*time.Second, 5*time.Millisecond)
	mu.Lock()
	assert.Len(t, changes, 1, "ten passes make one change")
	assert.Equal(t, portrule.Pass, changes[0].Result.State)
	decided := changes[0].Result.At
	mu.Unlock()
	assert.False(t, decided.IsZero(), "the change says when the run that decided it ended")
	assert.Equal(t, Results{tg.Key.PodUID: {{Key: tg.Key, Result: portrule.ProbeResult{State: portrule.Pass, At: decided}}}}, s.Results(res),
		"later passes change neither the result nor when it was decided")
	assert.GreaterOrEqual(t, testutil.ToFloat64(m.ProbeResults.WithLabelValues("TCP", metrics.OutcomeSuccess)), 10.0)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.Targets))

	// Declaring the same target again keeps its state.
	s.Set(res, []Target{tg})
	assert.Equal(t, Results{tg.Key.PodUID: {{Key: tg.Key, Result: portrule.ProbeResult{State: portrule.Pass, At: decided}}}}, s.Results(res))
}

func TestTheProbeDigestFollowsTheProbesContent(t *testing.T) {
	p := v1alpha1.Probe{Mode: v1alpha1.ProbeModeHTTP, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3,
		HTTP: &v1alpha1.HTTPProbe{TargetPort: intstr.FromInt32(8080), Path: "/healthz"}}
	same := *p.DeepCopy()
	other := *p.DeepCopy()
	other.HTTP.Path = "/ready"
	assert.Equal(t, DigestProbe(p), DigestProbe(same), "the same content digests the same, whatever the pointers")
	assert.NotEqual(t, DigestProbe(p), DigestProbe(other), "a changed path is a new target")
}

func TestARunnerErrorCountsAsAFailure(t *testing.T) {
	changed := make(chan Change, 10)
	s, m := harness(t, Options{
		Runner:         RunnerFunc(func(context.Context, Target) Outcome { return Outcome{Err: errors.New("bad input")} }),
		OnChange:       func(c Change) { changed <- c },
		MaxStartSpread: time.Millisecond,
	})
	s.Set(res, []Target{target("p1", 0, 5*time.Millisecond, 1, 2)})
	c := <-changed
	assert.Equal(t, portrule.Fail, c.Result.State)
	assert.Contains(t, c.Result.Reason, "bad input")
	assert.GreaterOrEqual(t, testutil.ToFloat64(m.ProbeResults.WithLabelValues("TCP", metrics.OutcomeError)), 2.0)
}

// A deferred run (an input still loading) counts for nothing: with failureThreshold 1 it does
// not fail the target, and the runs that follow it decide as if it had not happened.
func TestADeferredRunCountsForNothing(t *testing.T) {
	var runs atomic.Int32
	changed := make(chan Change, 10)
	s, m := harness(t, Options{
		Runner: RunnerFunc(func(context.Context, Target) Outcome {
			if runs.Add(1) <= 3 {
				return Outcome{Deferred: true, Reason: "credentials Secret ns/db: not loaded yet"}
			}
			return Outcome{Pass: true}
		}),
		OnChange:       func(c Change) { changed <- c },
		MaxStartSpread: time.Millisecond,
	})
	tg := target("p1", 0, 5*time.Millisecond, 1, 1)
	s.Set(res, []Target{tg})
	c := <-changed
	assert.Equal(t, portrule.Pass, c.Result.State, "the first change is the pass: the deferred runs failed nothing")
	assert.GreaterOrEqual(t, runs.Load(), int32(4))
	assert.Equal(t, 3.0, testutil.ToFloat64(m.ProbeResults.WithLabelValues("TCP", metrics.OutcomeDeferred)))
	assert.Zero(t, testutil.ToFloat64(m.ProbeResults.WithLabelValues("TCP", metrics.OutcomeFailure)))
}

func TestTheFirstRunWaitsForTheInitialDelay(t *testing.T) {
	notBefore := time.Now().Add(300 * time.Millisecond)
	ran := make(chan time.Time, 100)
	s, _ := harness(t, Options{
		Runner:         RunnerFunc(func(context.Context, Target) Outcome { ran <- time.Now(); return Outcome{Pass: true} }),
		MaxStartSpread: time.Millisecond,
	})
	tg := target("p1", 0, 10*time.Millisecond, 1, 3)
	tg.NotBefore = notBefore
	s.Set(res, []Target{tg})
	first := <-ran
	assert.False(t, first.Before(notBefore), "first run at %s, before %s", first, notBefore)
}

func TestASlowTargetDoesNotDelayTheOthers(t *testing.T) {
	slowStarted := make(chan struct{})
	var fastRuns atomic.Int32
	s, _ := harness(t, Options{
		// One worker for the slow run, one for the fast, and one reserved for namespaces with
		// no run in flight (reserveFor), which this namespace may not take.
		Workers: 3,
		Runner: RunnerFunc(func(ctx context.Context, tg Target) Outcome {
			if tg.PodName == "slow" {
				close(slowStarted)
				<-ctx.Done() // hangs until its deadline or removal
				return Outcome{Reason: "timeout"}
			}
			fastRuns.Add(1)
			return Outcome{Pass: true}
		}),
		MaxStartSpread: time.Millisecond,
	})
	slow := target("slow", 0, 10*time.Millisecond, 1, 3)
	slow.Probe.TimeoutSeconds = 60
	s.Set(res, []Target{slow, target("fast", 0, 10*time.Millisecond, 1, 3)})
	<-slowStarted
	start := fastRuns.Load()
	require.Eventually(t, func() bool { return fastRuns.Load() >= start+20 }, 10*time.Second, 5*time.Millisecond)
	// Removing the slow target cancels its run at once (far before its 60 s timeout).
	s.Set(res, []Target{target("fast", 0, 10*time.Millisecond, 1, 3)})
	require.Eventually(t, func() bool { return s.Len() == 1 }, 10*time.Second, 5*time.Millisecond)
}

func TestConcurrencyIsBoundedByTheWorkers(t *testing.T) {
	var running, peak atomic.Int32
	ranPods := sync.Map{}
	s, _ := harness(t, Options{
		Workers: 3,
		Runner: RunnerFunc(func(ctx context.Context, tg Target) Outcome {
			n := running.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			select {
			case <-time.After(2 * time.Millisecond):
			case <-ctx.Done():
			}
			running.Add(-1)
			ranPods.Store(tg.PodName, true)
			return Outcome{Pass: true}
		}),
		MaxStartSpread: time.Millisecond,
	})
	// Three namespaces: one namespace alone never takes the worker reserved for the others
	// (reserveFor), so the full pool is used only when several namespaces have runs due.
	for n := range 3 {
		ns := fmt.Sprintf("ns%d", n)
		var ts []Target
		for i := range 10 {
			ts = append(ts, nsTarget(ns, "web", fmt.Sprintf("p%d", n*10+i), 20*time.Millisecond))
		}
		s.Set(types.NamespacedName{Namespace: ns, Name: "web"}, ts)
	}
	require.Eventually(t, func() bool {
		n := 0
		ranPods.Range(func(any, any) bool { n++; return true })
		return n == 30
	}, 10*time.Second, 5*time.Millisecond)
	assert.LessOrEqual(t, peak.Load(), int32(3))
	assert.Equal(t, int32(3), peak.Load(), "the pool was used fully")
}

func TestRemovedTargetsLeaveNothingBehind(t *testing.T) {
	var runs atomic.Int32
	// The harness stops the scheduler at the end and checks that no goroutine is left.
	s, m := harness(t, Options{
		Workers: 4,
		Runner: RunnerFunc(func(ctx context.Context, _ Target) Outcome {
			runs.Add(1)
			return Outcome{Pass: true}
		}),
		MaxStartSpread: time.Millisecond,
	})
	var ts []Target
	for i := range 200 {
		ts = append(ts, target(fmt.Sprintf("p%d", i), i%3, 5*time.Millisecond, 1, 3))
	}
	s.Set(res, ts)
	other := types.NamespacedName{Namespace: "ns", Name: "other"}
	s.Set(other, []Target{target("q", 0, 5*time.Millisecond, 1, 3)})
	assert.Equal(t, 201.0, testutil.ToFloat64(m.Targets))
	require.Eventually(t, func() bool { return runs.Load() >= 400 }, 10*time.Second, 5*time.Millisecond)

	s.Set(res, nil)
	assert.Equal(t, 1, s.Len(), "only the other resource's target is left")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.Targets))
	assert.Empty(t, s.Results(res))
	s.Set(other, nil)
	assert.Equal(t, 0.0, testutil.ToFloat64(m.Targets))
	// Once the cancelled runs have ended, no state of a resource or namespace is left.
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.running == 0 && len(s.resources) == 0 && len(s.namespaces) == 0 && len(s.waiting) == 0 &&
			s.withTargets == 0 && len(s.timers) == 0 && len(s.lateReported) == 0
	}, 10*time.Second, 5*time.Millisecond)
}

// Set compares the declared targets with the resource's own before it changes anything (the
// common reconcile declares the same ones again); a declaration that repeats one target and
// leaves another out still removes that one, and the results stay by pod.
func TestSetWithTheSameTargetsKeepsThemAndARepeatedOneDoesNotHideARemovedOne(t *testing.T) {
	m := metrics.New(nil)
	s := New(Options{Metrics: m, Runner: RunnerFunc(func(context.Context, Target) Outcome { return Outcome{Pass: true} })})
	a, b, c := target("p1", 0, time.Hour, 1, 3), target("p1", 1, time.Hour, 1, 3), target("p2", 0, time.Hour, 1, 3)
	s.Set(res, []Target{a, b, c})
	s.Set(res, []Target{c, b, a})
	assert.Equal(t, 3, s.Len())
	got := s.Results(res)
	assert.Len(t, got, 2, "two pods")
	assert.Len(t, got["p1"], 2, "two targets of pod p1")
	_, ok := got.Of(b.Key)
	assert.True(t, ok)

	s.Set(res, []Target{a, a, c})
	assert.Equal(t, 2, s.Len(), "b is gone though the declaration has three entries")
	assert.Equal(t, 2.0, testutil.ToFloat64(m.Targets))
	got = s.Results(res)
	_, ok = got.Of(b.Key)
	assert.False(t, ok)
	assert.Len(t, got["p1"], 1)
	_, ok = got.Of(a.Key)
	assert.True(t, ok)
}
