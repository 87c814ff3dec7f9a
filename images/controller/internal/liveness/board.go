// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package liveness

import (
	"slices"
	"sync"
)

// Judgement is the part of a verdict the status shows: who is stale and whether the guard
// holds. It changes only when an agent turns stale or fresh, or the guard turns on or off.
type Judgement struct {
	// Known is how many agents the tracker knew.
	Known int
	// Stale are the nodes whose agent is stale, sorted.
	Stale []string
	// Guarded is true while more than half of the known agents look stale: nothing is withdrawn.
	Guarded bool
	// LookStale is, while the guard holds, how many agents look stale at once (the verdict's
	// late ones, which the guard counts); zero otherwise.
	LookStale int
}

// Board holds the latest judgement of the liveness runner for the status writer (DESIGN §6:
// status has one writer, the reconciler; the runner only publishes here). It is safe for
// concurrent use.
type Board struct {
	mu  sync.Mutex
	cur Judgement
}

// NewBoard returns a board on which no agent is stale yet.
func NewBoard() *Board { return &Board{} }

// Current returns the latest judgement. Before the first one nothing is stale, which is also
// what the first judgement of a new leader says: the grace restarts with leadership.
func (b *Board) Current() Judgement {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := b.cur
	cur.Stale = slices.Clone(cur.Stale)
	return cur
}

// Publish records the verdict and returns the nodes whose resources must show it anew: the
// nodes that turned stale or fresh, and every stale node (before and after) when the guard
// turned on or off or, while it holds, the number of known agents or of those that look stale
// changed (its message counts them). Nothing is returned when nothing a status shows changed.
func (b *Board) Publish(v Verdict) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	prev := b.cur
	next := Judgement{Known: v.Known, Stale: slices.Clone(v.Stale), Guarded: v.Guarded}
	if v.Guarded {
		next.LookStale = len(v.Late)
	}
	slices.Sort(next.Stale)
	b.cur = next
	everyStale := prev.Guarded != next.Guarded || (next.Guarded && (prev.Known != next.Known || prev.LookStale != next.LookStale))
	var out []string
	for _, n := range prev.Stale {
		if everyStale || !slices.Contains(next.Stale, n) {
			out = append(out, n)
		}
	}
	for _, n := range next.Stale {
		if (everyStale || !slices.Contains(prev.Stale, n)) && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}
