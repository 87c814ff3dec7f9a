// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package scheduler runs probes on a schedule with a bounded pool of workers, applies the
// success and failure thresholds, and reports a target's result only when it changes (the
// kubelet prober's manager, workers and results cache in one small piece).
//
// A target is (resource, pod, probe). Targets are declared per resource with Set; the
// scheduler starts, keeps and forgets them to match. Goroutines do not grow with targets: one
// dispatcher and a fixed number of workers. The workers are shared fairly (fair.go): one
// namespace may have at most its share of them in flight, so probes that hang until their
// timeout in one namespace cannot delay another namespace's probes.
package scheduler

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
)

// Key identifies a target: (resource, pod, probe index) and a fingerprint of everything a run
// depends on. When a probe or the pod's address changes, the target is a new one with a fresh
// threshold count; an unchanged one keeps its state across reconciles. Keys are comparable and
// of fixed size (the probe is hashed once per reconcile, not formatted per pod).
type Key struct {
	Resource types.NamespacedName
	PodUID   types.UID
	// Probe is the index of the probe in spec.healthcheck.probes.
	Probe       int
	Fingerprint Fingerprint
}

// Fingerprint is what one run depends on besides the pod: the probe's content, the address
// dialled, the resolved port and the period.
type Fingerprint struct {
	Probe   ProbeDigest
	Address string
	Port    int32
	Period  time.Duration
}

// ProbeDigest is a digest of a probe's content (DigestProbe).
type ProbeDigest [16]byte

// DigestProbe digests a probe: the SHA-256 of its JSON encoding, truncated. Compute it once per
// probe and reconcile and share it among the probe's targets.
func DigestProbe(p v1alpha1.Probe) ProbeDigest {
	raw, err := json.Marshal(p)
	if err != nil {
		// A probe is plain data; this cannot happen. Fall back to a digest of its Go text.
		raw = fmt.Appendf(nil, "%#v", p)
	}
	sum := sha256.Sum256(raw)
	var d ProbeDigest
	copy(d[:], sum[:])
	return d
}

// Target is one probe of one pod.
type Target struct {
	Key   Key
	Probe v1alpha1.Probe
	// Namespace of the pod (and of credential Secrets).
	Namespace string
	PodName   string
	PodIP     string
	// Port is the probe's target port resolved on the pod.
	Port int32
	// NotBefore is the pod's start plus initialDelaySeconds: no run happens earlier.
	NotBefore time.Time
	// Period is periodSeconds.
	Period time.Duration
}

// NewKey builds the key of a target from its parts; digest is DigestProbe of the probe.
func NewKey(resource types.NamespacedName, podUID types.UID, index int, digest ProbeDigest, podIP string, port int32, period time.Duration) Key {
	return Key{Resource: resource, PodUID: podUID, Probe: index, Fingerprint: Fingerprint{Probe: digest, Address: podIP, Port: port, Period: period}}
}

// Outcome of one run.
type Outcome struct {
	Pass   bool
	Reason string
	// Err is set when the probe could not be run at all; the run counts as a failure.
	Err error
	// Deferred is set when the probe was not run because an input is still loading (a
	// credential Secret being read): the run counts for nothing, the target keeps its state and
	// runs again at its next due time.
	Deferred bool
}

// Runner runs one probe once (the prober, behind a small interface).
type Runner interface {
	Run(ctx context.Context, t Target) Outcome
}

// RunnerFunc adapts a function to a Runner.
type RunnerFunc func(ctx context.Context, t Target) Outcome

// Run calls f.
func (f RunnerFunc) Run(ctx context.Context, t Target) Outcome { return f(ctx, t) }

// Change is a target's new thresholded result.
type Change struct {
	Key    Key
	Target Target
	Result portrule.ProbeResult
}

// Options configure a Scheduler.
type Options struct {
	// Workers bounds how many probes run at once (default 16). One namespace may have at most
	// Workers divided by the namespaces with targets in flight, never less than one.
	Workers int
	Runner  Runner
	// OnChange is called, from a worker, when a target's result changes. It must not block.
	OnChange func(Change)
	// OnLate is called, from a worker, when a run of the resource starts more than one period
	// after it was due, at most once per LateReportInterval and resource; lateness is how late
	// that run started. It must not block. Lateness is only reported: it changes no result.
	OnLate func(resource types.NamespacedName, lateness time.Duration)
	// LateReportInterval is how often OnLate may be called for one resource (default a minute).
	LateReportInterval time.Duration
	Metrics            *metrics.Metrics
	Clock              clock.WithTicker
	Logger             logr.Logger
	// Jitter is the fraction of the period by which each run is moved at random (default 0.1);
	// a new target's first run is spread over [0, min(period, MaxStartSpread)).
	Jitter float64
	// MaxStartSpread bounds the random delay of a new target's first run (default 2s).
	MaxStartSpread time.Duration
}

// DefaultLateReportInterval is the default of Options.LateReportInterval.
const DefaultLateReportInterval = time.Minute

// Scheduler runs targets. Start it once; Set may be called before or after.
type Scheduler struct {
	opts Options

	mu      sync.Mutex
	targets map[Key]*entry
	// resources and namespaces that have targets or runs in flight.
	resources  map[types.NamespacedName]*resState
	namespaces map[string]*nsState
	// withTargets is how many namespaces have targets (namespaceCap divides the pool by it).
	withTargets int
	// timers holds the targets whose next run is not due yet, by due time; a due one moves to
	// its resource's queue until a worker is free for it.
	timers entryHeap
	// epoch is the origin of the heaps' due times (entryHeap keeps them as integers).
	epoch time.Time
	// waiting are the resources with due runs queued (resState.waitIndex is the position).
	waiting []*resState
	// running is how many runs are in flight (at most Workers).
	running int
	// lateReported is when OnLate was last called, by resource.
	lateReported map[types.NamespacedName]time.Time
	wake         chan struct{}
	// runBase is the context every run derives from: Start's values, not its cancellation,
	// which Start passes on to the runs in flight itself (a run registered with one shared
	// parent would take its lock twice per run).
	runBase context.Context
	// byMode holds the run metrics bound to their labels for the known modes, so that a run
	// updates them without looking the labels up; read-only after New.
	byMode map[v1alpha1.ProbeMode]*modeMetrics

	// Scratch space of nextLocked.
	cands []candidate
	// setMark stamps the entries unchangedLocked has seen in one call.
	setMark uint64
}

// nsState is a namespace with targets or runs in flight.
type nsState struct {
	targets int
	running int
}

// resState is a resource with targets or runs in flight.
type resState struct {
	name    types.NamespacedName
	ns      *nsState
	entries map[Key]*entry
	// byPod holds the same entries by pod: Results hands them out that way.
	byPod   map[types.UID][]*entry
	running int
	// queue holds the resource's due runs waiting for a worker, by due time.
	queue entryHeap
	// waitIndex is the resource's position in Scheduler.waiting, -1 when not there.
	waitIndex int
}

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

// Where an entry is queued.
const (
	notQueued = iota // running, or removed
	inTimers
	inQueue
)

type entry struct {
	t      Target
	res    *resState
	due    time.Time
	where  int // notQueued, inTimers or inQueue
	index  int // in the heap it is queued in; -1 when not queued
	cancel context.CancelFunc
	gone   bool
	mark   uint64 // Scheduler.setMark of the last unchangedLocked that saw it

	run    int  // consecutive runs with the same raw outcome
	last   bool // that raw outcome
	result portrule.ProbeResult
}

// New returns a Scheduler.
func New(opts Options) *Scheduler {
	if opts.Workers <= 0 {
		opts.Workers = 16
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.New(nil)
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	if opts.Jitter == 0 {
		opts.Jitter = 0.1
	}
	if opts.MaxStartSpread == 0 {
		opts.MaxStartSpread = 2 * time.Second
	}
	if opts.OnChange == nil {
		opts.OnChange = func(Change) {}
	}
	if opts.OnLate == nil {
		opts.OnLate = func(types.NamespacedName, time.Duration) {}
	}
	if opts.LateReportInterval <= 0 {
		opts.LateReportInterval = DefaultLateReportInterval
	}
	byMode := map[v1alpha1.ProbeMode]*modeMetrics{}
	for _, mode := range []v1alpha1.ProbeMode{v1alpha1.ProbeModeTCP, v1alpha1.ProbeModeHTTP, v1alpha1.ProbeModePostgreSQL} {
		byMode[mode] = newModeMetrics(opts.Metrics, string(mode))
	}
	return &Scheduler{
		opts:         opts,
		targets:      map[Key]*entry{},
		resources:    map[types.NamespacedName]*resState{},
		namespaces:   map[string]*nsState{},
		epoch:        opts.Clock.Now(),
		lateReported: map[types.NamespacedName]time.Time{},
		wake:         make(chan struct{}, 1),
		byMode:       byMode,
	}
}

// when is t as the heaps keep it: nanoseconds from the epoch (monotonic with the real clock).
func (s *Scheduler) when(t time.Time) int64 { return int64(t.Sub(s.epoch)) }

// Set makes the targets of resource exactly ts. Targets already known keep their state and
// schedule; new ones start Unknown; missing ones are forgotten (a running probe is cancelled).
func (s *Scheduler) Set(resource types.NamespacedName, ts []Target) {
	now := s.opts.Clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unchangedLocked(resource, ts) {
		return
	}
	want := make(map[Key]Target, len(ts))
	for _, t := range ts {
		want[t.Key] = t
	}
	if r := s.resources[resource]; r != nil {
		for k, e := range r.entries {
			if _, ok := want[k]; !ok {
				s.removeLocked(k, e)
			}
		}
	}
	for k, t := range want {
		if _, ok := s.targets[k]; ok {
			continue
		}
		r := s.resourceLocked(resource)
		e := &entry{t: t, res: r, index: -1}
		e.due = t.NotBefore
		if e.due.Before(now) {
			e.due = now
		}
		e.due = e.due.Add(s.spread(t.Period))
		s.targets[k] = e
		r.entries[k] = e
		r.byPod[k.PodUID] = append(r.byPod[k.PodUID], e)
		if r.ns.targets++; r.ns.targets == 1 {
			s.withTargets++
		}
		s.queueLocked(e, inTimers)
	}
	s.opts.Metrics.Targets.Set(float64(len(s.targets)))
	s.poke()
}

// unchangedLocked tells whether ts are exactly the targets the resource has (a reconcile that
// changes no pod and no probe, the common case, sets the same targets again): then Set has
// nothing to do, and finds it out without building a set of the keys.
func (s *Scheduler) unchangedLocked(resource types.NamespacedName, ts []Target) bool {
	r := s.resources[resource]
	if r == nil || len(r.entries) > len(ts) {
		return false
	}
	s.setMark++
	distinct := 0
	for i := range ts {
		e := r.entries[ts[i].Key]
		if e == nil {
			return false
		}
		if e.mark != s.setMark {
			e.mark = s.setMark
			distinct++
		}
	}
	return distinct == len(r.entries)
}

// resourceLocked returns the state of a resource, making it (and its namespace's) if needed.
func (s *Scheduler) resourceLocked(name types.NamespacedName) *resState {
	r := s.resources[name]
	if r != nil {
		return r
	}
	ns := s.namespaces[name.Namespace]
	if ns == nil {
		ns = &nsState{}
		s.namespaces[name.Namespace] = ns
	}
	r = &resState{name: name, ns: ns, entries: map[Key]*entry{}, byPod: map[types.UID][]*entry{}, waitIndex: -1}
	s.resources[name] = r
	return r
}

// dropLocked forgets a resource (and its namespace) that has neither targets nor runs in flight.
func (s *Scheduler) dropLocked(r *resState) {
	if len(r.entries) > 0 || r.running > 0 || len(r.queue) > 0 {
		return
	}
	delete(s.resources, r.name)
	s.unwaitLocked(r)
	if r.ns.targets == 0 && r.ns.running == 0 && s.namespaces[r.name.Namespace] == r.ns {
		delete(s.namespaces, r.name.Namespace)
	}
}

func (s *Scheduler) queueLocked(e *entry, where int) {
	e.where = where
	if where == inTimers {
		s.timers.push(e, s.when(e.due))
		return
	}
	r := e.res
	r.queue.push(e, s.when(e.due))
	if r.waitIndex < 0 {
		r.waitIndex = len(s.waiting)
		s.waiting = append(s.waiting, r)
	}
}

func (s *Scheduler) unqueueLocked(e *entry) {
	switch e.where {
	case inTimers:
		s.timers.remove(e.index)
	case inQueue:
		e.res.queue.remove(e.index)
		if len(e.res.queue) == 0 {
			s.unwaitLocked(e.res)
		}
	}
	e.where = notQueued
}

// unwaitLocked takes a resource off the waiting list (the last one takes its place).
func (s *Scheduler) unwaitLocked(r *resState) {
	i := r.waitIndex
	if i < 0 {
		return
	}
	last := len(s.waiting) - 1
	s.waiting[i] = s.waiting[last]
	s.waiting[i].waitIndex = i
	s.waiting[last] = nil
	s.waiting = s.waiting[:last]
	r.waitIndex = -1
}

func (s *Scheduler) removeLocked(k Key, e *entry) {
	e.gone = true
	s.unqueueLocked(e)
	if e.cancel != nil {
		e.cancel()
	}
	delete(s.targets, k)
	r := e.res
	delete(r.entries, k)
	if rest := slices.DeleteFunc(r.byPod[k.PodUID], func(x *entry) bool { return x == e }); len(rest) > 0 {
		r.byPod[k.PodUID] = rest
	} else {
		delete(r.byPod, k.PodUID)
	}
	if r.ns.targets--; r.ns.targets == 0 {
		s.withTargets--
	}
	if len(r.entries) == 0 {
		delete(s.lateReported, r.name)
	}
	s.dropLocked(r)
}

// Results are the thresholded results of one resource's targets, by pod: a reconcile finds the
// few results of a pod with one lookup of its uid instead of hashing every target's whole key.
type Results map[types.UID][]Result

// Result is the thresholded result of one target.
type Result struct {
	Key    Key
	Result portrule.ProbeResult
}

// Of is the result of target k, and whether the scheduler has that target.
func (rs Results) Of(k Key) (portrule.ProbeResult, bool) {
	for _, r := range rs[k.PodUID] {
		if r.Key == k {
			return r.Result, true
		}
	}
	return portrule.ProbeResult{}, false
}

// Results returns the current thresholded results of every target of a resource (a copy: the
// reconcile decides from it). A target without a decisive result is Unknown.
func (s *Scheduler) Results(resource types.NamespacedName) Results {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.resources[resource]
	if r == nil {
		return Results{}
	}
	out := make(Results, len(r.byPod))
	all := make([]Result, 0, len(r.entries))
	for uid, es := range r.byPod {
		start := len(all)
		for _, e := range es {
			all = append(all, Result{Key: e.t.Key, Result: e.result})
		}
		out[uid] = all[start:len(all):len(all)]
	}
	return out
}

// Len is the number of targets.
func (s *Scheduler) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.targets)
}

func (s *Scheduler) spread(period time.Duration) time.Duration {
	max := min(period, s.opts.MaxStartSpread)
	if max <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(max)))
}

func (s *Scheduler) jitter(period time.Duration) time.Duration {
	j := time.Duration(float64(period) * s.opts.Jitter)
	if j <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(2*j))) - j
}

func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Start runs the dispatcher and the workers until ctx ends, then waits for every run to stop
// and forgets all targets. It fits manager.Runnable.
func (s *Scheduler) Start(ctx context.Context) error {
	// Runs take ctx's values; its end reaches them through cancelRunsLocked below.
	s.runBase = context.WithoutCancel(ctx)
	// The dispatcher hands a run over only while fewer than Workers are in flight, so the
	// buffer always has room and the hand-over never blocks under the lock.
	work := make(chan *entry, s.opts.Workers)
	var wg sync.WaitGroup
	for range s.opts.Workers {
		wg.Go(func() {
			for e := range work {
				s.runOne(ctx, e)
			}
		})
	}
	s.dispatch(ctx, work)
	// ctx has ended: cancel the runs in flight. A run not started yet sees ctx's end itself
	// (runOne checks it under the lock, where it would also have set its cancel).
	s.mu.Lock()
	for _, e := range s.targets {
		if e.cancel != nil {
			e.cancel()
		}
	}
	s.mu.Unlock()
	close(work)
	wg.Wait()
	s.mu.Lock()
	for k, e := range s.targets {
		s.removeLocked(k, e)
	}
	s.opts.Metrics.Targets.Set(0)
	s.mu.Unlock()
	return nil
}

// dispatch moves due targets to their resources' queues and starts runs while a worker is free
// (nextLocked decides which). A slow probe holds one worker for at most its timeout. It sleeps
// until the earliest timer or a poke: a new target, a run that became the earliest timer, or a
// worker freed while runs wait.
func (s *Scheduler) dispatch(ctx context.Context, work chan<- *entry) {
	// One timer, re-armed only when the earliest due time changes.
	var timer clock.Timer
	var timerC <-chan time.Time
	var armed bool
	var armedFor int64
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		s.mu.Lock()
		now := s.opts.Clock.Now()
		nowWhen := s.when(now)
		for len(s.timers) > 0 && s.timers[0].when <= nowWhen {
			s.queueLocked(s.timers.pop(), inQueue)
		}
		for s.running < s.opts.Workers {
			e := s.nextLocked()
			if e == nil {
				break
			}
			s.running++
			e.res.running++
			e.res.ns.running++
			work <- e
		}
		next := len(s.timers) > 0
		var nextWhen int64
		if next {
			nextWhen = s.timers[0].when
		}
		s.mu.Unlock()
		switch {
		case next && (!armed || nextWhen != armedFor):
			wait := time.Duration(nextWhen - nowWhen)
			if timer == nil {
				timer = s.opts.Clock.NewTimer(wait)
				timerC = timer.C()
			} else {
				timer.Reset(wait)
			}
			armed, armedFor = true, nextWhen
		case !next && armed:
			timer.Stop()
			armed = false
		}
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-timerC:
			armed = false
		}
	}
}

// nextLocked takes the due run that a free worker runs next (pick), or nil when none may start.
func (s *Scheduler) nextLocked() *entry {
	if len(s.waiting) == 0 {
		return nil
	}
	s.cands = s.cands[:0]
	for _, r := range s.waiting {
		s.cands = append(s.cands, candidate{
			Namespace: r.name.Namespace, NamespaceRunning: r.ns.running, ResourceRunning: r.running, Due: r.queue[0].e.due,
		})
	}
	i := pick(s.cands, namespaceCap(s.opts.Workers, s.withTargets))
	if i < 0 {
		return nil
	}
	r := s.waiting[i]
	e := r.queue.pop()
	e.where = notQueued
	if len(r.queue) == 0 {
		s.unwaitLocked(r)
	}
	return e
}

// pokeLocked wakes the dispatcher when it has something to do after a run ended: a worker is
// free and runs wait for one, or e, queued again, is now the earliest timer (the dispatcher may
// sleep until a later one). Otherwise the dispatcher's own timer is right, and a poke per run
// would wake it for nothing.
func (s *Scheduler) pokeLocked(e *entry) {
	if len(s.waiting) > 0 || (e != nil && e.where == inTimers && e.index == 0) {
		s.poke()
	}
}

// finishLocked ends a run's hold on its worker and its namespace's and resource's share.
func (s *Scheduler) finishLocked(e *entry) {
	s.running--
	e.res.running--
	e.res.ns.running--
	s.dropLocked(e.res)
}

// lateLocked tells whether a late run of the resource is to be reported now (at most once per
// LateReportInterval).
func (s *Scheduler) lateLocked(resource types.NamespacedName, now time.Time) bool {
	if last, ok := s.lateReported[resource]; ok && now.Sub(last) < s.opts.LateReportInterval {
		return false
	}
	s.lateReported[resource] = now
	return true
}

type dueKey struct{}

// Due is when the run that ctx belongs to was due (the context a Runner is given); a run that
// started later than that waited for a worker.
func Due(ctx context.Context) (time.Time, bool) {
	t, ok := ctx.Value(dueKey{}).(time.Time)
	return t, ok
}

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
	s.mu.Unlock()
	if report {
		s.opts.Logger.Info("probes start more than a period late", "resource", t.Key.Resource, "lateness", lateness.String(), "period", t.Period.String())
		s.opts.OnLate(t.Key.Resource, lateness)
	}

	out := s.opts.Runner.Run(runCtx, t)
	cancel()
	elapsed := s.opts.Clock.Since(start)

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
	mode := string(t.Probe.Mode)
	if mm := s.byMode[t.Probe.Mode]; mm != nil {
		mm.results[outcome].Inc()
		mm.duration[outcome].Observe(elapsed.Seconds())
	} else {
		s.opts.Metrics.ProbeResults.WithLabelValues(mode, outcomeLabels[outcome]).Inc()
		s.opts.Metrics.ProbeDuration.WithLabelValues(mode, outcomeLabels[outcome]).Observe(elapsed.Seconds())
	}

	s.mu.Lock()
	s.finishLocked(e)
	e.cancel = nil
	if e.gone || parent.Err() != nil {
		s.pokeLocked(nil)
		s.mu.Unlock()
		return
	}
	changed := false
	if !out.Deferred {
		changed = e.record(out.Pass, out.Reason)
	}
	res := e.result
	// The next run is one period after this one was due, moved by the jitter; a run that
	// overran its slot is rescheduled from now.
	now := start.Add(elapsed)
	e.due = e.due.Add(t.Period + s.jitter(t.Period))
	if e.due.Before(now) {
		e.due = now.Add(s.jitter(t.Period) + time.Duration(float64(t.Period)*s.opts.Jitter))
	}
	s.queueLocked(e, inTimers)
	s.pokeLocked(e)
	s.mu.Unlock()
	if changed {
		s.opts.Metrics.ProbeTransitions.WithLabelValues(mode, res.State.String()).Inc()
		s.opts.Logger.V(1).Info("probe result changed", "resource", t.Key.Resource, "pod", t.PodName, "probe", t.Key.Probe, "state", res.State.String(), "reason", res.Reason)
		s.opts.OnChange(Change{Key: t.Key, Target: t, Result: res})
	}
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
