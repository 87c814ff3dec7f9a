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
		full      time.Time
		now       time.Time
		burst     int
		wantDelay time.Duration
		wantFull  time.Time
	}{
		"a key never queued is queued at once": {
			now: t0, burst: 1, wantDelay: 0, wantFull: t0.Add(window),
		},
		"a key whose budget is whole is queued at once": {
			full: t0, now: t0, burst: 1, wantDelay: 0, wantFull: t0.Add(window),
		},
		"a key queued long ago is queued at once": {
			full: t0, now: t0.Add(time.Hour), burst: 1, wantDelay: 0, wantFull: t0.Add(time.Hour + window),
		},
		"with a burst of one, a change right after the leading queueing waits for the end of its window": {
			full: t0.Add(window), now: t0.Add(time.Millisecond), burst: 1, wantDelay: window - time.Millisecond, wantFull: t0.Add(2 * window),
		},
		"with a burst of one, a change at the very time of the last queueing waits a whole window": {
			full: t0.Add(window), now: t0, burst: 1, wantDelay: window, wantFull: t0.Add(2 * window),
		},
		"a change while a trailing queueing is pending joins it": {
			full: t0.Add(2 * window), now: t0.Add(50 * time.Millisecond), burst: 1, wantDelay: window - 50*time.Millisecond, wantFull: t0.Add(2 * window),
		},
		"a change within the window after the trailing queueing waits for the next window's end": {
			full: t0.Add(2 * window), now: t0.Add(window + time.Millisecond), burst: 1, wantDelay: window - time.Millisecond, wantFull: t0.Add(3 * window),
		},
		"a change right after a queueing is queued at once while the budget lasts": {
			full: t0.Add(window), now: t0.Add(time.Millisecond), burst: 3, wantDelay: 0, wantFull: t0.Add(2 * window),
		},
		"the change that finds the budget spent waits until it has one queueing again": {
			full: t0.Add(3 * window), now: t0.Add(time.Millisecond), burst: 3, wantDelay: window - time.Millisecond, wantFull: t0.Add(4 * window),
		},
		"a change while that queueing is pending joins it": {
			full: t0.Add(4 * window), now: t0.Add(2 * time.Millisecond), burst: 3, wantDelay: window - 2*time.Millisecond, wantFull: t0.Add(4 * window),
		},
		"a burst below one counts as one": {
			full: t0.Add(window), now: t0, burst: 0, wantDelay: window, wantFull: t0.Add(2 * window),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d, full := coalesce.Delay(tc.full, tc.now, window, tc.burst)
			assert.Equal(t, tc.wantDelay, d)
			assert.Equal(t, tc.wantFull, full)
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
	c := coalesce.New[string](window, 1, clock.Now)
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
	c := coalesce.New[string](window, 1, clock.Now)
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
	c := coalesce.New[string](window, 1, clock.Now)
	assert.Zero(t, c.Next("web"))
	assert.Equal(t, window, c.Next("web"), "a second change at the same instant is coalesced")
	c.Forget("web")
	assert.Zero(t, c.Next("web"), "a forgotten key is queued at once")
}

// A few changes close together are each queued at once while the budget lasts; the one that
// finds it spent waits for the budget's next queueing, and burst quiet windows refill it.
func TestChangesCloseTogetherAreQueuedAtOnceWhileTheBudgetLasts(t *testing.T) {
	clock := &fakeClock{now: t0}
	c := coalesce.New[string](window, 3, clock.Now)
	for i := range 3 {
		clock.now = t0.Add(time.Duration(i) * 40 * time.Millisecond)
		assert.Zero(t, c.Next("web"), "change %d is queued at once", i+1)
	}
	clock.now = t0.Add(120 * time.Millisecond)
	assert.Equal(t, window-120*time.Millisecond, c.Next("web"), "the fourth waits until a queueing is regained")
	clock.now = t0.Add(130 * time.Millisecond)
	assert.Equal(t, window-130*time.Millisecond, c.Next("web"), "the fifth joins it")
	assert.Zero(t, c.Next("db"), "another key has its own budget")

	clock.now = t0.Add(window + 4*window)
	for i := range 3 {
		assert.Zero(t, c.Next("web"), "after burst quiet windows change %d is queued at once again", i+1)
	}
}

// A storm (one change a millisecond for ten windows) costs at most burst queueings plus one per
// window: the budget's three at once, then one at the end of each window.
func TestAStormCostsTheBurstPlusOneQueueingPerWindow(t *testing.T) {
	clock := &fakeClock{now: t0}
	c := coalesce.New[string](window, 3, clock.Now)
	queued := map[time.Time]bool{}
	changes := 0
	for clock.now.Before(t0.Add(10 * window)) {
		queued[clock.now.Add(c.Next("web"))] = true
		changes++
		clock.now = clock.now.Add(time.Millisecond)
	}
	assert.Equal(t, 2000, changes)
	assert.Len(t, queued, 3+10, "three at once and one at the end of each of the ten windows")
	for at := range queued {
		if at.Sub(t0) >= window {
			assert.Zero(t, at.Sub(t0)%window, "queued at %v, not at a window boundary", at.Sub(t0))
		}
	}
}
