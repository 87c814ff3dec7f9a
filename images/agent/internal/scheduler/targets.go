// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package scheduler

import (
	"math/rand/v2"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
)

// Set makes the targets of resource exactly ts, or the first of them its share of the budget
// allows (budget.go), and returns how many of ts are in budget. Targets already known keep
// their state and schedule; new ones start Unknown; missing ones and those over budget are
// forgotten (a running probe is cancelled). When the resource's demand moved the shares, the
// other resources whose allowance changed are trimmed here and handed to Options.OnBudget.
func (s *Scheduler) Set(resource types.NamespacedName, ts []Target) int {
	now := s.opts.Clock.Now()
	s.mu.Lock()
	if r := s.resources[resource]; r != nil && r.asked == len(ts) && s.unchangedLocked(resource, ts[:r.allowed]) {
		s.mu.Unlock()
		return r.allowed
	}
	r := s.resourceLocked(resource)
	notify := s.admitLocked(r, len(ts))
	allowed := r.allowed
	s.setLocked(r, ts[:allowed], now)
	s.dropLocked(r)
	s.opts.Metrics.Targets.Set(float64(len(s.targets)))
	s.opts.Metrics.TargetsOverBudget.Set(float64(s.asked - len(s.targets)))
	s.poke()
	s.mu.Unlock()
	for _, name := range notify {
		s.opts.OnBudget(name)
	}
	return allowed
}

// Admit records that a resource asks for n targets, shares the budget out again when that
// changed its demand, and returns how many of them are in budget: what Set will keep of n
// targets, unless another demand changes first. It starts and stops no target of the resource
// (Set does); the other resources whose allowance changed are trimmed and handed to OnBudget.
func (s *Scheduler) Admit(resource types.NamespacedName, n int) int {
	s.mu.Lock()
	r := s.resourceLocked(resource)
	notify := s.admitLocked(r, n)
	allowed := r.allowed
	s.dropLocked(r)
	s.opts.Metrics.Targets.Set(float64(len(s.targets)))
	s.opts.Metrics.TargetsOverBudget.Set(float64(s.asked - len(s.targets)))
	s.mu.Unlock()
	for _, name := range notify {
		s.opts.OnBudget(name)
	}
	return allowed
}

// admitLocked records r's demand of n targets; when it changed, it shares the budget out again
// and trims the other resources whose allowance shrank. It returns the other resources whose
// allowance changed, for OnBudget once the lock is released.
func (s *Scheduler) admitLocked(r *resState, n int) []types.NamespacedName {
	if r.asked == n {
		return nil
	}
	s.askLocked(r, n)
	others := s.allocateLocked(r.ns)
	notify := make([]types.NamespacedName, 0, len(others))
	for _, o := range others {
		if o == r {
			continue
		}
		s.trimLocked(o)
		notify = append(notify, o.name)
	}
	return notify
}

// setLocked makes the targets of r exactly ts (each keeps its position in ts as its ordinal).
func (s *Scheduler) setLocked(r *resState, ts []Target, now time.Time) {
	want := make(map[Key]int, len(ts))
	for i, t := range ts {
		want[t.Key] = i
	}
	for k, e := range r.entries {
		if i, ok := want[k]; ok {
			e.ordinal = i
		} else {
			s.removeLocked(k, e)
		}
	}
	for i, t := range ts {
		if _, ok := r.entries[t.Key]; ok || want[t.Key] != i {
			continue
		}
		e := &entry{t: t, res: r, index: -1, ordinal: i}
		e.due = t.NotBefore
		if e.due.Before(now) {
			e.due = now
		}
		e.due = e.due.Add(s.spread(t.Period))
		s.targets[t.Key] = e
		r.entries[t.Key] = e
		r.byPod[t.Key.PodUID] = append(r.byPod[t.Key.PodUID], e)
		if r.ns.targets++; r.ns.targets == 1 {
			s.withTargets++
		}
		s.queueLocked(e, inTimers)
	}
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
			e.ordinal = i
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
		ns = &nsState{name: name.Namespace}
		s.namespaces[name.Namespace] = ns
	}
	r = &resState{name: name, ns: ns, entries: map[Key]*entry{}, byPod: map[types.UID][]*entry{}, waitIndex: -1}
	s.resources[name] = r
	return r
}

// dropLocked forgets a resource (and its namespace) that has neither targets nor runs in flight.
func (s *Scheduler) dropLocked(r *resState) {
	if len(r.entries) > 0 || r.running > 0 || len(r.queue) > 0 || r.asked > 0 {
		return
	}
	delete(s.resources, r.name)
	s.unwaitLocked(r)
	if r.ns.targets == 0 && r.ns.running == 0 && r.ns.asked == 0 && s.namespaces[r.name.Namespace] == r.ns {
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

func (s *Scheduler) spread(period time.Duration) time.Duration {
	bound := min(period, s.opts.MaxStartSpread)
	if bound <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(bound)))
}

func (s *Scheduler) jitter(period time.Duration) time.Duration {
	j := time.Duration(float64(period) * s.opts.Jitter)
	if j <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(2*j))) - j
}
