// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package liveness judges the agents and acts on the judgement (DESIGN §5,
// development/LIVENESS.md), in the agent's observe → decide → apply shape:
//
//   - observe (observe.go): the Runner lists the agents' node Leases and the Nodes and feeds the
//     Tracker; the Withdrawer reads the slices of the stale nodes and their resources;
//   - decide (tracker.go, withdraw.go's Plan, board.go): pure. An agent is stale when the
//     controller has not seen its node Lease's renewTime change for longer than the grace, on
//     the controller's own (injected) clock; the renewTime value itself is only compared for
//     change, because the clocks of nodes and controller differ. While more than half of the
//     agents look stale at once the guard holds and nothing is withdrawn. Plan says which
//     slices to withdraw;
//   - apply (withdraw.go's Withdrawer): every endpoint of our slices of a stale node is set to
//     ready=false, serving=false through the program's one slice writer (slicewrite); the
//     slices are kept for the returning agent, which republishes after its own decisive
//     results. The verdict is published on the Board for the status writer.
package liveness

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// DefaultGrace is how long an agent's renewTime may stand still before the agent is stale
// (like the kubelet's node-monitor-grace-period).
const DefaultGrace = 40 * time.Second

type entry struct {
	renewTime  time.Time
	lastChange time.Time
}

// Tracker remembers, per node, the controller's local time at which it last saw the node's
// Lease renewTime change. It is safe for concurrent use.
type Tracker struct {
	clock clock.PassiveClock
	grace time.Duration

	mu    sync.Mutex
	nodes map[string]*entry
}

// NewTracker returns a tracker with the given clock (the real clock when nil) and grace
// (DefaultGrace when not positive).
func NewTracker(clk clock.PassiveClock, grace time.Duration) *Tracker {
	if clk == nil {
		clk = clock.RealClock{}
	}
	if grace <= 0 {
		grace = DefaultGrace
	}
	return &Tracker{clock: clk, grace: grace, nodes: map[string]*entry{}}
}

// Grace is the tracker's grace.
func (t *Tracker) Grace() time.Duration { return t.grace }

// Observe records the renewTime of a node's Lease as just seen. A node seen for the first time,
// or whose renewTime differs from the last one seen, counts as alive now. It reports whether
// the renewTime changed (or the node is new).
func (t *Tracker) Observe(node string, renewTime time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.nodes[node]
	if ok && e.renewTime.Equal(renewTime) {
		return false
	}
	if !ok {
		e = &entry{}
		t.nodes[node] = e
	}
	e.renewTime = renewTime
	e.lastChange = t.clock.Now()
	return true
}

// Seen returns the last renewTime seen for a node and the local time it was first seen; ok is
// false for a node the tracker does not know.
func (t *Tracker) Seen(node string) (renewTime, lastChange time.Time, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.nodes[node]
	if !ok {
		return time.Time{}, time.Time{}, false
	}
	return e.renewTime, e.lastChange, true
}

// Forget drops a node (its Lease was deleted, or the node is gone): it is neither fresh nor
// stale and no longer counts towards the guard.
func (t *Tracker) Forget(node string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.nodes, node)
}

// Reset restarts the grace of every known node now. Call it when the controller wins
// leadership: what an earlier leader or a blind spell saw is not held against the agents.
func (t *Tracker) Reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.Now()
	for _, e := range t.nodes {
		e.lastChange = now
	}
}

// Verdict is the tracker's judgement at one instant.
type Verdict struct {
	// Known is how many agents the tracker knows.
	Known int
	// Stale are the nodes whose agent is stale, sorted.
	Stale []string
	// Late are the nodes whose agent has been silent for more than half the grace, the stale
	// ones among them, sorted: the agents that stopped at about the same time as the stale
	// ones. Agents that stop together do not go stale in the same instant: their last
	// renewals are up to a renewal interval (at most a quarter of the grace) and one
	// observation apart. A live agent is never late: it renews every quarter of the grace at
	// most (DESIGN §5, the chart derives the interval), seen within one observation (every
	// eighth of the grace, but no more often than every 0.5 s; the grace is at least 4 s).
	Late []string
	// Guarded is true when some agent is stale and more than half of the known agents look
	// stale at once (are late): then the blame is more likely the controller's or the API
	// server's, and nothing may be withdrawn. Counting the late ones, not only the stale ones,
	// keeps the first agents of a fleet that stopped together from being withdrawn before the
	// rest of it goes stale.
	Guarded bool
	// Reason says, for humans, why the guard holds ("" when it does not).
	Reason string
	// NextCheck is how long until the next fresh agent could turn stale (zero when none is
	// fresh): the caller judges again then.
	NextCheck time.Duration
	// At is when the verdict was judged: the trigger time of the withdrawal it causes.
	At time.Time
}

// Withdraw are the nodes whose endpoints must be withdrawn: the stale ones, or none while the
// guard holds.
func (v Verdict) Withdraw() []string {
	if v.Guarded {
		return nil
	}
	return v.Stale
}

// Judge returns the verdict now.
func (t *Tracker) Judge() Verdict {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.Now()
	v := Verdict{Known: len(t.nodes), At: now}
	for node, e := range t.nodes {
		silent := now.Sub(e.lastChange)
		if silent > t.grace/2 {
			v.Late = append(v.Late, node)
		}
		if silent > t.grace {
			v.Stale = append(v.Stale, node)
			continue
		}
		// Stale strictly after the grace: check again just past it.
		if next := t.grace - silent + time.Millisecond; v.NextCheck == 0 || next < v.NextCheck {
			v.NextCheck = next
		}
	}
	sort.Strings(v.Stale)
	sort.Strings(v.Late)
	if len(v.Stale) > 0 && 2*len(v.Late) > v.Known {
		v.Guarded = true
		v.Reason = fmt.Sprintf("%d of %d agents look stale at once (more than half): suspecting the API server or the controller rather than the agents, nothing is withdrawn", len(v.Late), v.Known)
	}
	return v
}
