// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package coalesce decides when a change of a key is queued: leading-edge coalescing with a
// fixed window. The first change of a key that has not been queued within the last window is
// queued at once; changes that follow within the window are gathered into one more queueing
// when the window since the last one ends. A burst therefore costs at most two queueings (the
// leading one and one trailing) per window, and a storm of changes about one per window.
package coalesce

import (
	"sync"
	"time"
)

// Delay is the timing decision as a pure function. last is when the key was last queued for
// (zero if never; it may lie in the future when a trailing queueing is pending), now is the
// change's time. It returns how long to wait before queueing (0: queue at once) and the new
// "last queued for" time of the key.
func Delay(last, now time.Time, window time.Duration) (time.Duration, time.Time) {
	switch {
	case last.IsZero() || !now.Before(last.Add(window)):
		// Quiet for a whole window: the leading edge.
		return 0, now
	case now.Before(last):
		// A trailing queueing is pending: join it.
		return last.Sub(now), last
	default:
		// Within the window of the last queueing: the trailing edge at its end.
		next := last.Add(window)
		return next.Sub(now), next
	}
}

// Coalescer keeps the last queueing time of every key. It is safe for concurrent use.
type Coalescer[K comparable] struct {
	window time.Duration
	now    func() time.Time

	mu     sync.Mutex
	last   map[K]time.Time
	pruned time.Time
}

// New returns a Coalescer with the window; now is the clock (nil: time.Now).
func New[K comparable](window time.Duration, now func() time.Time) *Coalescer[K] {
	if now == nil {
		now = time.Now
	}
	return &Coalescer[K]{window: window, now: now, last: map[K]time.Time{}}
}

// Next records a change of key and returns how long to wait before queueing it (0: at once).
func (c *Coalescer[K]) Next(key K) time.Duration {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	d, last := Delay(c.last[key], now, c.window)
	c.last[key] = last
	// Keys quiet for a whole window carry no state; drop them (at most once per window) so
	// the map does not grow with keys that are gone.
	if !now.Before(c.pruned.Add(c.window)) {
		c.pruned = now
		for k, t := range c.last {
			if !now.Before(t.Add(c.window)) {
				delete(c.last, k)
			}
		}
	}
	return d
}

// Forget drops the state of key (a deleted resource).
func (c *Coalescer[K]) Forget(key K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.last, key)
}
