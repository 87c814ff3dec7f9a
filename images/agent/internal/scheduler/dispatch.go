// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package scheduler

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
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
// It only gathers the candidates: who goes first is fair.go's alone (namespaceCap, reserveFor
// and pick).
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
	i := pick(s.cands, namespaceCap(s.opts.Workers, s.withTargets), s.opts.Workers-s.running, reserveFor(s.opts.Workers))
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
