// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package liveness

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	clocktesting "k8s.io/utils/clock/testing"
)

// step is one thing that happens to the tracker: a Lease observed with a renewTime (seconds of
// the node's own clock), the controller's clock advancing, a leadership win, or a node dropped.
type step struct {
	observe string
	renew   int
	advance time.Duration
	reset   bool
	forget  string
}

func obs(node string, renew int) step { return step{observe: node, renew: renew} }
func wait(d time.Duration) step       { return step{advance: d} }
func forget(node string) step         { return step{forget: node} }

var (
	reset = step{reset: true}
	// nodeEpoch is far from the controller's clock: renewTime values are compared only for change.
	nodeEpoch = time.Date(1999, 1, 1, 0, 0, 0, 0, time.UTC)
)

func TestJudge(t *testing.T) {
	const grace = 40 * time.Second
	tests := map[string]struct {
		steps       []step
		wantStale   []string
		wantLate    []string
		wantGuarded bool
		wantNext    time.Duration
	}{
		"an agent whose renewTime keeps changing is never stale": {
			steps:    []step{obs("a", 1), obs("b", 1), obs("c", 1), wait(30 * time.Second), obs("a", 2), obs("b", 2), obs("c", 2), wait(30 * time.Second)},
			wantLate: []string{"a", "b", "c"}, // late, but with none stale the guard has nothing to hold
			wantNext: 10*time.Second + time.Millisecond,
		},
		"an agent is not stale exactly at the grace": {
			steps:    []step{obs("a", 1), obs("b", 1), obs("c", 1), wait(grace)},
			wantLate: []string{"a", "b", "c"},
			wantNext: time.Millisecond,
			// All three are silent for exactly the grace: none is stale yet.
		},
		"an agent whose renewTime stands still past the grace is stale": {
			steps:     []step{obs("a", 1), obs("b", 1), obs("c", 1), wait(30 * time.Second), obs("b", 2), obs("c", 2), wait(11 * time.Second)},
			wantStale: []string{"a"},
			wantLate:  []string{"a"},
			wantNext:  29*time.Second + time.Millisecond,
		},
		"seeing the same renewTime again does not count as a renewal": {
			steps:     []step{obs("a", 1), obs("b", 1), obs("c", 1), wait(30 * time.Second), obs("a", 1), obs("b", 2), obs("c", 2), wait(11 * time.Second)},
			wantStale: []string{"a"},
			wantLate:  []string{"a"},
			wantNext:  29*time.Second + time.Millisecond,
		},
		"a renewTime that goes backwards still counts as a change": {
			steps:    []step{obs("a", 5), obs("b", 1), wait(30 * time.Second), obs("a", 4), obs("b", 2), wait(30 * time.Second)},
			wantLate: []string{"a", "b"},
			wantNext: 10*time.Second + time.Millisecond,
		},
		"winning leadership restarts the grace of a stale agent": {
			steps:    []step{obs("a", 1), obs("b", 1), obs("c", 1), wait(30 * time.Second), obs("b", 2), obs("c", 2), wait(20 * time.Second), reset, wait(39 * time.Second)},
			wantLate: []string{"a", "b", "c"},
			wantNext: time.Second + time.Millisecond,
		},
		"after the restarted grace the silent agent is stale again": {
			steps:     []step{obs("a", 1), obs("b", 1), obs("c", 1), wait(50 * time.Second), reset, obs("b", 2), obs("c", 2), wait(30 * time.Second), obs("b", 3), obs("c", 3), wait(11 * time.Second)},
			wantStale: []string{"a"},
			wantLate:  []string{"a"},
			wantNext:  29*time.Second + time.Millisecond,
		},
		"more than half stale at once holds the guard": {
			steps:       []step{obs("a", 1), obs("b", 1), obs("c", 1), wait(30 * time.Second), obs("c", 2), wait(11 * time.Second)},
			wantStale:   []string{"a", "b"},
			wantLate:    []string{"a", "b"},
			wantGuarded: true,
			wantNext:    29*time.Second + time.Millisecond,
		},
		// Agents that stop together go stale up to a renewal interval and an observation apart:
		// when the first crosses the grace, the others have been silent for most of it.
		"agents that stopped a renewal after a stale one hold the guard with it": {
			steps:       []step{obs("a", 1), obs("b", 1), obs("c", 1), obs("d", 1), wait(8 * time.Second), obs("b", 2), obs("c", 2), obs("d", 2), wait(25 * time.Second), obs("d", 3), wait(8 * time.Second)},
			wantStale:   []string{"a"},
			wantLate:    []string{"a", "b", "c"},
			wantGuarded: true,
			wantNext:    7*time.Second + time.Millisecond,
		},
		"half of the agents late, one of them stale, withdraws the stale one": {
			steps:     []step{obs("a", 1), obs("b", 1), obs("c", 1), obs("d", 1), wait(8 * time.Second), obs("b", 2), obs("c", 2), obs("d", 2), wait(25 * time.Second), obs("c", 3), obs("d", 3), wait(8 * time.Second)},
			wantStale: []string{"a"},
			wantLate:  []string{"a", "b"},
			wantNext:  7*time.Second + time.Millisecond,
		},
		"an agent silent for exactly half the grace is not late": {
			steps:     []step{obs("a", 1), obs("b", 1), obs("c", 1), wait(21 * time.Second), obs("b", 2), obs("c", 2), wait(20 * time.Second)},
			wantStale: []string{"a"},
			wantLate:  []string{"a"},
			wantNext:  20*time.Second + time.Millisecond,
		},
		"exactly half stale does not hold the guard": {
			steps:     []step{obs("a", 1), obs("b", 1), obs("c", 1), obs("d", 1), wait(30 * time.Second), obs("c", 2), obs("d", 2), wait(11 * time.Second)},
			wantStale: []string{"a", "b"},
			wantLate:  []string{"a", "b"},
			wantNext:  29*time.Second + time.Millisecond,
		},
		"every agent stale (an API outage) holds the guard": {
			steps:       []step{obs("a", 1), obs("b", 1), obs("c", 1), wait(2 * grace)},
			wantStale:   []string{"a", "b", "c"},
			wantLate:    []string{"a", "b", "c"},
			wantGuarded: true,
		},
		"a single agent, stale, holds the guard": {
			steps:       []step{obs("a", 1), wait(grace + time.Second)},
			wantStale:   []string{"a"},
			wantLate:    []string{"a"},
			wantGuarded: true,
		},
		"a forgotten node no longer counts": {
			steps:     []step{obs("a", 1), obs("b", 1), obs("c", 1), wait(30 * time.Second), obs("c", 2), forget("b"), obs("d", 1), wait(11 * time.Second)},
			wantStale: []string{"a"},
			wantLate:  []string{"a"},
			wantNext:  29*time.Second + time.Millisecond,
		},
		"a tracker that knows no agent has nothing to say": {},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC))
			tr := NewTracker(clk, grace)
			for _, s := range tc.steps {
				switch {
				case s.observe != "":
					tr.Observe(s.observe, nodeEpoch.Add(time.Duration(s.renew)*time.Second))
				case s.forget != "":
					tr.Forget(s.forget)
				case s.reset:
					tr.Reset()
				default:
					clk.Step(s.advance)
				}
			}
			v := tr.Judge()
			assert.Equal(t, tc.wantStale, v.Stale)
			assert.Equal(t, tc.wantLate, v.Late)
			assert.Equal(t, tc.wantGuarded, v.Guarded)
			assert.Equal(t, tc.wantNext, v.NextCheck)
			if tc.wantGuarded {
				assert.Empty(t, v.Withdraw(), "nothing is withdrawn while the guard holds")
				assert.Contains(t, v.Reason, "more than half")
			} else {
				assert.Equal(t, tc.wantStale, v.Withdraw())
				assert.Empty(t, v.Reason)
			}
		})
	}
}

func TestObserveReportsAChange(t *testing.T) {
	tr := NewTracker(clocktesting.NewFakeClock(time.Now()), 0)
	assert.Equal(t, DefaultGrace, tr.Grace())
	assert.True(t, tr.Observe("a", nodeEpoch), "a new node is a change")
	assert.False(t, tr.Observe("a", nodeEpoch), "the same renewTime is not")
	assert.True(t, tr.Observe("a", nodeEpoch.Add(time.Second)), "a new renewTime is")
	renew, _, ok := tr.Seen("a")
	assert.True(t, ok)
	assert.Equal(t, nodeEpoch.Add(time.Second), renew)
	_, _, ok = tr.Seen("b")
	assert.False(t, ok, "an unknown node was not seen")
}

func TestGuardReasonCountsTheAgents(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	tr := NewTracker(clk, time.Second)
	tr.Observe("a", nodeEpoch)
	tr.Observe("b", nodeEpoch)
	clk.Step(2 * time.Second)
	v := tr.Judge()
	assert.True(t, strings.HasPrefix(v.Reason, "2 of 2 agents"), v.Reason)

	// The late agent counts with the stale one: 2 of 3 look stale, though 1 is past the grace.
	tr = NewTracker(clk, 40*time.Second)
	for _, n := range []string{"a", "b", "c"} {
		tr.Observe(n, nodeEpoch)
	}
	clk.Step(10 * time.Second)
	tr.Observe("b", nodeEpoch.Add(time.Second))
	tr.Observe("c", nodeEpoch.Add(time.Second))
	clk.Step(21 * time.Second)
	tr.Observe("c", nodeEpoch.Add(2*time.Second))
	clk.Step(10 * time.Second)
	v = tr.Judge()
	assert.Equal(t, []string{"a"}, v.Stale)
	assert.True(t, v.Guarded)
	assert.True(t, strings.HasPrefix(v.Reason, "2 of 3 agents"), v.Reason)
}
