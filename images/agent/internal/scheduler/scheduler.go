// Package scheduler runs probes on a schedule with a bounded pool of workers, applies the
// success and failure thresholds, and reports a target's result only when it changes (the
// kubelet prober's manager, workers and results cache in one small piece).
//
// A target is (resource, pod, probe). Targets are declared per resource with Set; the
// scheduler starts, keeps and forgets them to match. Goroutines do not grow with targets: one
// dispatcher and a fixed number of workers.
package scheduler

import (
	"container/heap"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/go-logr/logr"
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
	// Workers bounds how many probes run at once (default 16).
	Workers int
	Runner  Runner
	// OnChange is called, from a worker, when a target's result changes. It must not block.
	OnChange func(Change)
	Metrics  *metrics.Metrics
	Clock    clock.WithTicker
	Logger   logr.Logger
	// Jitter is the fraction of the period by which each run is moved at random (default 0.1);
	// a new target's first run is spread over [0, min(period, MaxStartSpread)).
	Jitter float64
	// MaxStartSpread bounds the random delay of a new target's first run (default 2s).
	MaxStartSpread time.Duration
}

// Scheduler runs targets. Start it once; Set may be called before or after.
type Scheduler struct {
	opts Options

	mu      sync.Mutex
	targets map[Key]*entry
	byRes   map[types.NamespacedName]map[Key]*entry
	queue   entryHeap
	wake    chan struct{}
}

type entry struct {
	t      Target
	due    time.Time
	index  int // in the heap; -1 when not queued (running or removed)
	cancel context.CancelFunc
	gone   bool

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
	return &Scheduler{
		opts:    opts,
		targets: map[Key]*entry{},
		byRes:   map[types.NamespacedName]map[Key]*entry{},
		wake:    make(chan struct{}, 1),
	}
}

// Set makes the targets of resource exactly ts. Targets already known keep their state and
// schedule; new ones start Unknown; missing ones are forgotten (a running probe is cancelled).
func (s *Scheduler) Set(resource types.NamespacedName, ts []Target) {
	now := s.opts.Clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	want := make(map[Key]Target, len(ts))
	for _, t := range ts {
		want[t.Key] = t
	}
	cur := s.byRes[resource]
	for k, e := range cur {
		if _, ok := want[k]; !ok {
			s.removeLocked(k, e)
		}
	}
	for k, t := range want {
		if _, ok := s.targets[k]; ok {
			continue
		}
		e := &entry{t: t, index: -1}
		e.due = t.NotBefore
		if e.due.Before(now) {
			e.due = now
		}
		e.due = e.due.Add(s.spread(t.Period))
		s.targets[k] = e
		if s.byRes[resource] == nil {
			s.byRes[resource] = map[Key]*entry{}
		}
		s.byRes[resource][k] = e
		heap.Push(&s.queue, e)
	}
	if len(s.byRes[resource]) == 0 {
		delete(s.byRes, resource)
	}
	s.opts.Metrics.Targets.Set(float64(len(s.targets)))
	s.poke()
}

func (s *Scheduler) removeLocked(k Key, e *entry) {
	e.gone = true
	if e.index >= 0 {
		heap.Remove(&s.queue, e.index)
	}
	if e.cancel != nil {
		e.cancel()
	}
	delete(s.targets, k)
	if m := s.byRes[k.Resource]; m != nil {
		delete(m, k)
		if len(m) == 0 {
			delete(s.byRes, k.Resource)
		}
	}
}

// Results returns the current thresholded results of every target of a resource, by key (a
// copy: the reconcile decides from it). A target without a decisive result is Unknown.
func (s *Scheduler) Results(resource types.NamespacedName) map[Key]portrule.ProbeResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[Key]portrule.ProbeResult, len(s.byRes[resource]))
	for k, e := range s.byRes[resource] {
		out[k] = e.result
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
	work := make(chan *entry)
	var wg sync.WaitGroup
	for range s.opts.Workers {
		wg.Go(func() {
			for e := range work {
				s.runOne(ctx, e)
			}
		})
	}
	s.dispatch(ctx, work)
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

// dispatch hands due targets to the workers. When all workers are busy it waits for one; a
// slow probe holds one worker for at most its timeout.
func (s *Scheduler) dispatch(ctx context.Context, work chan<- *entry) {
	for {
		s.mu.Lock()
		var next *entry
		var wait time.Duration
		if len(s.queue) > 0 {
			next = s.queue[0]
			wait = next.due.Sub(s.opts.Clock.Now())
			if wait <= 0 {
				heap.Pop(&s.queue)
				s.mu.Unlock()
				select {
				case work <- next:
				case <-ctx.Done():
					return
				}
				continue
			}
		}
		s.mu.Unlock()
		var timerC <-chan time.Time
		var timer clock.Timer
		if next != nil {
			timer = s.opts.Clock.NewTimer(wait)
			timerC = timer.C()
		}
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return
		case <-s.wake:
		case <-timerC:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

func (s *Scheduler) runOne(parent context.Context, e *entry) {
	s.mu.Lock()
	if e.gone {
		s.mu.Unlock()
		return
	}
	t := e.t
	s.opts.Metrics.SchedulingLag.Observe(max(s.opts.Clock.Since(e.due), 0).Seconds())
	runCtx, cancel := context.WithCancel(parent)
	e.cancel = cancel
	s.mu.Unlock()
	defer cancel()

	// The prober enforces timeoutSeconds; this bound only guards against a runner that does not.
	timeout := time.Duration(t.Probe.TimeoutSeconds)*time.Second + time.Second
	runCtx, cancelTimeout := context.WithTimeout(runCtx, timeout)
	start := s.opts.Clock.Now()
	out := s.opts.Runner.Run(runCtx, t)
	cancelTimeout()
	elapsed := s.opts.Clock.Since(start)

	outcome := metrics.OutcomeFailure
	switch {
	case out.Err != nil:
		outcome = metrics.OutcomeError
		out.Pass, out.Reason = false, "probe could not run: "+out.Err.Error()
	case out.Pass:
		outcome = metrics.OutcomeSuccess
	}
	mode := string(t.Probe.Mode)
	s.opts.Metrics.ProbeResults.WithLabelValues(mode, outcome).Inc()
	s.opts.Metrics.ProbeDuration.WithLabelValues(mode, outcome).Observe(elapsed.Seconds())

	s.mu.Lock()
	if e.gone || parent.Err() != nil {
		s.mu.Unlock()
		return
	}
	e.cancel = nil
	changed := e.record(out.Pass, out.Reason)
	res := e.result
	// The next run is one period after this one was due, moved by the jitter; a run that
	// overran its slot is rescheduled from now.
	now := s.opts.Clock.Now()
	e.due = e.due.Add(t.Period + s.jitter(t.Period))
	if e.due.Before(now) {
		e.due = now.Add(s.jitter(t.Period) + time.Duration(float64(t.Period)*s.opts.Jitter))
	}
	heap.Push(&s.queue, e)
	s.mu.Unlock()
	s.poke()
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

// entryHeap orders entries by due time.
type entryHeap []*entry

func (h entryHeap) Len() int           { return len(h) }
func (h entryHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h entryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

// Push adds an entry (heap.Interface).
func (h *entryHeap) Push(x any) {
	e := x.(*entry)
	e.index = len(*h)
	*h = append(*h, e)
}

// Pop removes the last entry (heap.Interface).
func (h *entryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	e.index = -1
	*h = old[:len(old)-1]
	return e
}
