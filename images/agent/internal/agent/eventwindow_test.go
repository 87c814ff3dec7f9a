// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

var windowT0 = time.Date(2026, 12, 4, 6, 0, 0, 0, time.UTC)

func transition(pod string, serving bool) Transition {
	return Transition{Pod: corev1.ObjectReference{Name: pod}, Port: "http", Serving: serving}
}

func TestWindowStep(t *testing.T) {
	a, b := transition("a", false), transition("b", true)
	tests := map[string]struct {
		w          eventWindow
		happened   []Transition
		writes     int
		now        time.Time
		want       eventWindow
		wantBatch  []Transition
		wantBudget int
		wantWait   time.Duration
	}{
		"a first transition is reported at once": {
			happened: []Transition{a}, writes: 1, now: windowT0,
			want: eventWindow{last: windowT0}, wantBatch: []Transition{a}, wantBudget: 1,
		},
		"a transition within the window waits for its end": {
			w: eventWindow{last: windowT0}, happened: []Transition{b}, writes: 1, now: windowT0.Add(500 * time.Millisecond),
			want:     eventWindow{transitions: []Transition{b}, writes: 1, last: windowT0},
			wantWait: EventWindow - 500*time.Millisecond,
		},
		"a reconcile within the window without transitions keeps the waiting ones and the wait": {
			w: eventWindow{transitions: []Transition{b}, writes: 1, last: windowT0}, now: windowT0.Add(time.Second),
			want:     eventWindow{transitions: []Transition{b}, writes: 1, last: windowT0},
			wantWait: EventWindow - time.Second,
		},
		"at the window's end the waiting transitions are reported with the writes that carried them": {
			w: eventWindow{transitions: []Transition{a}, writes: 1, last: windowT0}, happened: []Transition{b}, writes: 2, now: windowT0.Add(EventWindow),
			want: eventWindow{last: windowT0.Add(EventWindow)}, wantBatch: []Transition{a, b}, wantBudget: 3,
		},
		"nothing waiting, nothing happened: nothing to report or wait for": {
			w: eventWindow{last: windowT0}, now: windowT0.Add(time.Second),
			want: eventWindow{last: windowT0},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, batch, budget, wait := windowStep(tc.w, tc.happened, tc.writes, tc.now, EventWindow)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.wantBatch, batch)
			assert.Equal(t, tc.wantBudget, budget)
			assert.Equal(t, tc.wantWait, wait)
		})
	}
}

// The windows of two resources are separate, and a resource's window follows the injected
// clock: its first transition is reported at once, the next within the window when a reconcile
// finds the window ended.
func TestEventWindowsOnAFakeClock(t *testing.T) {
	now := windowT0
	w := newEventWindows(EventWindow, func() time.Time { return now })
	web, db := types.NamespacedName{Namespace: "ns", Name: "web"}, types.NamespacedName{Namespace: "ns", Name: "db"}
	a, b := transition("a", false), transition("b", true)

	batch, _, wait, at := w.add(web, nil, 0)
	assert.Empty(t, batch, "a resource without transitions has no window")
	assert.Zero(t, wait)
	assert.Equal(t, windowT0, at)
	assert.Empty(t, w.byResource)

	batch, budget, wait, _ := w.add(web, []Transition{a}, 1)
	assert.Equal(t, []Transition{a}, batch)
	assert.Equal(t, 1, budget)
	assert.Zero(t, wait)

	now = now.Add(time.Second)
	batch, _, wait, _ = w.add(web, []Transition{b}, 1)
	assert.Empty(t, batch)
	assert.Equal(t, EventWindow-time.Second, wait)
	batch, _, _, _ = w.add(db, []Transition{b}, 1)
	assert.Equal(t, []Transition{b}, batch, "another resource's window is its own")

	now = windowT0.Add(EventWindow)
	batch, budget, wait, _ = w.add(web, nil, 0)
	assert.Equal(t, []Transition{b}, batch)
	assert.Equal(t, 1, budget)
	assert.Zero(t, wait)

	w.forget(web)
	assert.NotContains(t, w.byResource, web)
	assert.Contains(t, w.byResource, db)
}
