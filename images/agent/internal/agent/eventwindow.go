// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// EventWindow is how often, at most, the agent reports the port transitions of one resource:
// the first transition after a quiet window is reported at once, the ones that follow within the
// window together when it ends.
const EventWindow = 2 * time.Second

// eventWindow is one resource's Event window: the transitions waiting for its end.
type eventWindow struct {
	transitions []Transition
	// writes counts the slice writes that carried them: the Event budget of the window.
	writes int
	// last is when the resource's transitions were last reported.
	last time.Time
}

// windowStep is the Event window as a pure function of the clock: the transitions happened,
// carried by writes slice writes, join the window w at now. When the window (of length) has
// ended since w.last and transitions wait, they are reported: step returns them as batch with
// the writes that carried them as budget, and the window restarts at now. Otherwise batch is
// empty and wait is how long until the window ends while transitions wait (0: nothing waits).
func windowStep(w eventWindow, happened []Transition, writes int, now time.Time, length time.Duration) (next eventWindow, batch []Transition, budget int, wait time.Duration) {
	w.transitions = append(w.transitions, happened...)
	w.writes += writes
	due := w.last.Add(length)
	if len(w.transitions) == 0 {
		return w, nil, 0, 0
	}
	if now.Before(due) {
		return w, nil, 0, due.Sub(now)
	}
	return eventWindow{last: now}, w.transitions, w.writes, 0
}

// eventWindows keep the Event window of every resource with transitions on this node, on an
// injected clock.
type eventWindows struct {
	length time.Duration
	now    func() time.Time

	mu         sync.Mutex
	byResource map[types.NamespacedName]eventWindow
}

// newEventWindows returns the windows of length; now is the clock (nil: time.Now).
func newEventWindows(length time.Duration, now func() time.Time) *eventWindows {
	if now == nil {
		now = time.Now
	}
	return &eventWindows{length: length, now: now, byResource: map[types.NamespacedName]eventWindow{}}
}

// add steps the window of res (windowStep) at the clock's now, which it returns too.
func (e *eventWindows) add(res types.NamespacedName, happened []Transition, writes int) (batch []Transition, budget int, wait time.Duration, now time.Time) {
	now = e.now()
	e.mu.Lock()
	defer e.mu.Unlock()
	w, ok := e.byResource[res]
	if !ok && len(happened) == 0 {
		return nil, 0, 0, now
	}
	w, batch, budget, wait = windowStep(w, happened, writes, now, e.length)
	e.byResource[res] = w
	return batch, budget, wait, now
}

// forget drops the window of res (a deleted resource).
func (e *eventWindows) forget(res types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.byResource, res)
}
