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
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
)

// Options configure a Scheduler.
type Options struct {
	// MaxTargets bounds the targets kept, shared between namespaces (budget.go); 0 is no bound.
	MaxTargets int
	// OnBudget is called, after Set returns, for every other resource whose allowance of
	// targets changed (another namespace's demand moved the shares): it must reconcile
	// again. It must not block.
	OnBudget func(resource types.NamespacedName)
	// Workers bounds how many probes run at once (default 16). One namespace may have at most
	// Workers divided by the namespaces with targets in flight, never less than one, and one
	// with runs in flight never takes the reserve (reserveFor) kept for the others.
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
	// asked is how many targets all resources ask for (admitted or not).
	asked int
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

// nsState is a namespace with targets, runs in flight or targets asked for.
type nsState struct {
	name    string
	targets int
	running int
	// asked is how many targets its resources ask for, allowed its share of the budget
	// (budget.go); res are its resources that ask for any, by name.
	asked, allowed int
	res            []*resState
}

// resState is a resource with targets or runs in flight.
type resState struct {
	name    types.NamespacedName
	ns      *nsState
	entries map[Key]*entry
	// byPod holds the same entries by pod: Results hands them out that way.
	byPod   map[types.UID][]*entry
	running int
	// asked is how many targets the last Set gave, allowed how many of them are in budget.
	asked, allowed int
	// queue holds the resource's due runs waiting for a worker, by due time.
	queue entryHeap
	// waitIndex is the resource's position in Scheduler.waiting, -1 when not there.
	waitIndex int
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
	// ordinal is the target's position in what Set was last given for its resource: the
	// budget keeps a resource's first targets (trimLocked).
	ordinal int

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
	if opts.OnBudget == nil {
		opts.OnBudget = func(types.NamespacedName) {}
	}
	if opts.OnLate == nil {
		opts.OnLate = func(types.NamespacedName, time.Duration) {}
	}
	if opts.LateReportInterval <= 0 {
		opts.LateReportInterval = DefaultLateReportInterval
	}
	opts.MaxTargets = max(opts.MaxTargets, 0)
	opts.Metrics.ProbeBudget.Set(float64(opts.MaxTargets))
	byMode := map[v1alpha1.ProbeMode]*modeMetrics{}
	for _, mode := range []v1alpha1.ProbeMode{v1alpha1.ProbeModeTCP, v1alpha1.ProbeModeHTTP, v1alpha1.ProbeModePostgreSQL, v1alpha1.ProbeModeMySQL, v1alpha1.ProbeModeGRPC} {
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

// Len is the number of targets.
func (s *Scheduler) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.targets)
}

// InFlight is how many runs are in flight, and Waiting how many resources have a due run that
// waits for a worker (what pick may not start yet).
func (s *Scheduler) InFlight() (running, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running, len(s.waiting)
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
	s.opts.Metrics.TargetsOverBudget.Set(0)
	s.mu.Unlock()
	return nil
}
