// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package coalesce decides when a change of a key is queued: leading-edge coalescing with a
// budget of queueings per key that refills by one every window (a token bucket of burst
// queueings). A change of a key with budget left is queued at once; once the budget is spent,
// the changes that follow are gathered into one queueing at the time the budget has one
// queueing again. A key quiet for burst windows has its whole budget: a few changes close
// together (independent endpoints of one resource) are each queued at once, while a storm of
// changes costs at most burst queueings plus one per window.
//
// With a burst of 1 this is plain leading-edge coalescing: a change of a key not queued within
// the last window is queued at once, the changes that follow within the window at its end.
package coalesce

import (
	"sync"
	"time"
)

// Delay is the timing decision as a pure function (the generic cell rate algorithm). full is
// when the key's budget is whole again (zero if it has never been queued; it may lie up to
// burst windows in the future), now is the change's time. It returns how long to wait before
// queueing (0: queue at once) and the key's new full time. burst below 1 counts as 1.
func Delay(full, now time.Time, window time.Duration, burst int) (time.Duration, time.Time) {
	burst = max(burst, 1)
	spent := full.Add(-time.Duration(burst) * window)
	if now.Before(spent) {
		// The budget is spent and a queueing is pending at the time it has one again: join it.
		return spent.Sub(now), full
	}
	// The budget has a queueing at full - (burst-1) windows: at once if that is not later
	// than now, else then (and that queueing is the pending one the next changes join).
	at := full.Add(-time.Duration(burst-1) * window)
	if at.Before(now) {
		at = now
	}
	if full.Before(now) {
		full = now
	}
	return at.Sub(now), full.Add(window)
}

// Coalescer keeps the budget of every key. It is safe for concurrent use.
type Coalescer[K comparable] struct {
	window time.Duration
	burst  int
	now    func() time.Time

	mu     sync.Mutex
	full   map[K]time.Time
	pruned time.Time
}

// New returns a Coalescer with the window and the burst (at least 1); now is the clock (nil:
// time.Now).
func New[K comparable](window time.Duration, burst int, now func() time.Time) *Coalescer[K] {
	if now == nil {
		now = time.Now
	}
	return &Coalescer[K]{window: window, burst: max(burst, 1), now: now, full: map[K]time.Time{}}
}

// Next records a change of key and returns how long to wait before queueing it (0: at once).
func (c *Coalescer[K]) Next(key K) time.Duration {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	d, full := Delay(c.full[key], now, c.window, c.burst)
	c.full[key] = full
	// Keys whose budget is whole carry no state; drop them (at most once per window) so the
	// map does not grow with keys that are gone.
	if !now.Before(c.pruned.Add(c.window)) {
		c.pruned = now
		for k, t := range c.full {
			if !now.Before(t) {
				delete(c.full, k)
			}
		}
	}
	return d
}

// Forget drops the state of key (a deleted resource).
func (c *Coalescer[K]) Forget(key K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.full, key)
}
