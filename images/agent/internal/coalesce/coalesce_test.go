// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package coalesce_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/coalesce"
)

const window = 200 * time.Millisecond

var t0 = time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)

func TestDelay(t *testing.T) {
	tests := map[string]struct {
		last      time.Time
		now       time.Time
		wantDelay time.Duration
		wantLast  time.Time
	}{
		"a key never queued is queued at once": {
			now: t0, wantDelay: 0, wantLast: t0,
		},
		"a key queued a whole window ago is queued at once": {
			last: t0, now: t0.Add(window), wantDelay: 0, wantLast: t0.Add(window),
		},
		"a key queued long ago is queued at once": {
			last: t0, now: t0.Add(time.Hour), wantDelay: 0, wantLast: t0.Add(time.Hour),
		},
		"a change right after the leading queueing waits for the end of its window": {
			last: t0, now: t0.Add(time.Millisecond), wantDelay: window - time.Millisecond, wantLast: t0.Add(window),
		},
		"a change at the very time of the last queueing waits a whole window": {
			last: t0, now: t0, wantDelay: window, wantLast: t0.Add(window),
		},
		"a change while a trailing queueing is pending joins it": {
			last: t0.Add(window), now: t0.Add(50 * time.Millisecond), wantDelay: window - 50*time.Millisecond, wantLast: t0.Add(window),
		},
		"a change within the window after the trailing queueing waits for the next window's end": {
			last: t0.Add(window), now: t0.Add(window + time.Millisecond), wantDelay: window - time.Millisecond, wantLast: t0.Add(2 * window),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d, last := coalesce.Delay(tc.last, tc.now, window)
			assert.Equal(t, tc.wantDelay, d)
			assert.Equal(t, tc.wantLast, last)
		})
	}
}

// fakeClock is the injected clock of the Coalescer tests.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

// A storm of changes (one a millisecond for ten windows) is queued about once per window: the
// leading queueing plus one at the end of each window, never two within one window.
func TestAStormIsQueuedAboutOncePerWindow(t *testing.T) {
	clock := &fakeClock{now: t0}
	c := coalesce.New[string](window, clock.Now)
	queued := map[time.Time]bool{}
	changes := 0
	for clock.now.Before(t0.Add(10 * window)) {
		queued[clock.now.Add(c.Next("web"))] = true
		changes++
		clock.now = clock.now.Add(time.Millisecond)
	}
	assert.Equal(t, 2000, changes)
	assert.Len(t, queued, 11, "the leading queueing and one at the end of each of the ten windows")
	for at := range queued {
		assert.Zero(t, at.Sub(t0)%window, "queued at %v, not at a window boundary", at.Sub(t0))
	}
}

func TestABurstIsAtMostALeadingAndATrailingQueueing(t *testing.T) {
	clock := &fakeClock{now: t0}
	c := coalesce.New[string](window, clock.Now)
	assert.Zero(t, c.Next("web"), "the first change is queued at once")
	clock.now = t0.Add(10 * time.Millisecond)
	assert.Equal(t, window-10*time.Millisecond, c.Next("web"))
	clock.now = t0.Add(150 * time.Millisecond)
	assert.Equal(t, window-150*time.Millisecond, c.Next("web"), "the same trailing time")
	assert.Zero(t, c.Next("db"), "another key has its own window")

	clock.now = t0.Add(3 * window)
	assert.Zero(t, c.Next("web"), "after a quiet window the next change is queued at once again")
}

func TestForgetStartsAKeyAfresh(t *testing.T) {
	clock := &fakeClock{now: t0}
	c := coalesce.New[string](window, clock.Now)
	assert.Zero(t, c.Next("web"))
	assert.Equal(t, window, c.Next("web"), "a second change at the same instant is coalesced")
	c.Forget("web")
	assert.Zero(t, c.Next("web"), "a forgotten key is queued at once")
}
