// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package liveness

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestBoardPublish(t *testing.T) {
	tests := map[string]struct {
		before  *Verdict
		next    Verdict
		changed []string
	}{
		"the first verdict with nothing stale changes nothing": {
			next: Verdict{Known: 3},
		},
		"the first verdict names its stale nodes": {
			next: Verdict{Known: 3, Stale: []string{"b"}}, changed: []string{"b"},
		},
		"the same verdict again changes nothing": {
			before: &Verdict{Known: 3, Stale: []string{"b"}}, next: Verdict{Known: 3, Stale: []string{"b"}},
		},
		"nodes turning stale and fresh are named": {
			before: &Verdict{Known: 4, Stale: []string{"a"}}, next: Verdict{Known: 4, Stale: []string{"b"}}, changed: []string{"a", "b"},
		},
		"the guard turning on names every stale node": {
			before: &Verdict{Known: 3, Stale: []string{"a"}}, next: Verdict{Known: 3, Stale: []string{"a", "b"}, Guarded: true}, changed: []string{"a", "b"},
		},
		"the guard turning off names every node stale before": {
			before: &Verdict{Known: 3, Stale: []string{"a", "b"}, Guarded: true}, next: Verdict{Known: 3, Stale: []string{"b"}}, changed: []string{"a", "b"},
		},
		"while the guard holds, a new agent changes the count every message shows": {
			before: &Verdict{Known: 3, Stale: []string{"a", "b"}, Guarded: true}, next: Verdict{Known: 4, Stale: []string{"a", "b", "c"}, Guarded: true}, changed: []string{"a", "b", "c"},
		},
		"while the guard holds, another agent looking stale changes the count every message shows": {
			before: &Verdict{Known: 3, Stale: []string{"a"}, Late: []string{"a", "b"}, Guarded: true}, next: Verdict{Known: 3, Stale: []string{"a"}, Late: []string{"a", "b", "c"}, Guarded: true}, changed: []string{"a"},
		},
		"without the guard, a late agent changes nothing shown": {
			before: &Verdict{Known: 4, Stale: []string{"a"}, Late: []string{"a"}}, next: Verdict{Known: 4, Stale: []string{"a"}, Late: []string{"a", "b"}},
		},
		"without the guard, a new agent changes nothing shown": {
			before: &Verdict{Known: 3, Stale: []string{"a"}}, next: Verdict{Known: 4, Stale: []string{"a"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			b := NewBoard()
			if tc.before != nil {
				b.Publish(*tc.before)
			}
			assert.Equal(t, tc.changed, b.Publish(tc.next))
			got := b.Current()
			want := Judgement{Known: tc.next.Known, Stale: tc.next.Stale, Guarded: tc.next.Guarded}
			if tc.next.Guarded {
				want.LookStale = len(tc.next.Late)
			}
			assert.Equal(t, want, got)
		})
	}
}
