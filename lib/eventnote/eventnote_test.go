// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package eventnote

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
)

func TestCap(t *testing.T) {
	tests := map[string]struct {
		in      string
		limit   int
		want    string
		wantLen int
	}{
		"a short note is kept":              {in: "pod web-0 is drained", limit: MaxBytes, want: "pod web-0 is drained"},
		"a note of exactly the limit stays": {in: strings.Repeat("x", MaxBytes), limit: MaxBytes, want: strings.Repeat("x", MaxBytes)},
		"a long note is cut with an ellipsis": {in: strings.Repeat("x", 5000), limit: MaxBytes,
			want: strings.Repeat("x", MaxBytes-len(ellipsis)) + ellipsis},
		"multi-byte runes are not split":             {in: strings.Repeat("€", 1000), limit: MaxBytes, wantLen: MaxBytes - 1},
		"a limit below the ellipsis cuts without it": {in: "abcdef", limit: 2, want: "ab"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := CapTo(tc.in, tc.limit)
			assert.LessOrEqual(t, len(got), tc.limit)
			assert.True(t, utf8.ValidString(got))
			if tc.want != "" {
				assert.Equal(t, tc.want, got)
			}
			if tc.wantLen != 0 {
				assert.Len(t, got, tc.wantLen)
			}
		})
	}
}

func TestJoin(t *testing.T) {
	many := make([]string, 200)
	for i := range many {
		many[i] = fmt.Sprintf("endpoint 10.0.%d.%d (pod %q): names no pod of node n-1", i/250, i%250, fmt.Sprintf("web-%d", i))
	}
	tests := map[string]struct {
		head   string
		items  []string
		limit  int
		want   string
		prefix string
		suffix string
	}{
		"everything fits":               {head: "Deleted: ", items: []string{"a", "b"}, limit: 100, want: "Deleted: a; b"},
		"no items is the head":          {head: "Deleted", limit: 100, want: "Deleted"},
		"the rest is counted":           {head: "h: ", items: []string{"aaaa", "bbbb", "cccc"}, limit: 22, want: "h: aaaa and 2 more"},
		"two hundred endpoints":         {head: "Deleted EndpointSlice x published for node \"n-1\": ", items: many, limit: MaxBytes, prefix: "Deleted EndpointSlice x published for node \"n-1\": endpoint 10.0.0.0", suffix: " more"},
		"a first item too long is cut":  {head: "h: ", items: []string{strings.Repeat("z", 300), "b"}, limit: 100, prefix: "h: zzz", suffix: "… and 1 more"},
		"a single item too long is cut": {head: "h: ", items: []string{strings.Repeat("z", 300)}, limit: 100, prefix: "h: zzz", suffix: "…"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := Join(tc.head, tc.items, "; ", tc.limit)
			assert.LessOrEqual(t, len(got), tc.limit, got)
			if tc.want != "" {
				assert.Equal(t, tc.want, got)
			}
			assert.True(t, strings.HasPrefix(got, tc.prefix), got)
			assert.True(t, strings.HasSuffix(got, tc.suffix), got)
		})
	}
	got := Join("h: ", many, "; ", MaxBytes)
	listed := strings.Count(got, "(pod ")
	assert.Contains(t, got, fmt.Sprintf(" and %d more", len(many)-listed), "what is left out is counted exactly")
}

func TestAction(t *testing.T) {
	long := strings.Repeat("p", 200)
	tests := map[string]struct {
		base  string
		parts []string
		want  string
	}{
		"no parts is the base":     {base: "Probe", want: "Probe"},
		"parts are joined":         {base: "Drain", parts: []string{"http,metrics"}, want: "Drain/http,metrics"},
		"two parts":                {base: "Probe", parts: []string{"budget", "3-of-40"}, want: "Probe/budget/3-of-40"},
		"a long key is its digest": {base: "Drain", parts: []string{long}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := Action(tc.base, tc.parts...)
			assert.LessOrEqual(t, len(got), MaxActionBytes)
			if tc.want != "" {
				assert.Equal(t, tc.want, got)
			}
			assert.True(t, strings.HasPrefix(got, tc.base))
		})
	}
	assert.NotEqual(t, Action("Drain", long+"a"), Action("Drain", long+"b"), "different long keys give different actions")
}

// recorded is an events.EventRecorder that keeps what it is given.
type recorded struct {
	events.EventRecorder
	actions, notes []string
}

func (r *recorded) Eventf(_, _ runtime.Object, _, _, action, note string, args ...any) {
	r.actions = append(r.actions, action)
	r.notes = append(r.notes, fmt.Sprintf(note, args...))
}

func TestRecorderCapsEveryNote(t *testing.T) {
	inner := &recorded{}
	r := Capped(inner)
	r.Eventf(nil, nil, "Warning", "ForgedEndpointSlice", "DeleteForgedSlice", "Deleted %s: %s", "x", strings.Repeat("endpoint; ", 500))
	r.Eventf(nil, nil, "Normal", "Short", "Do", "%d%% done", 50)
	r.Eventf(nil, nil, "Normal", "Plain", strings.Repeat("a", 300), "100% literal, no arguments")
	require.Len(t, inner.notes, 3)
	assert.LessOrEqual(t, len(inner.notes[0]), MaxBytes)
	assert.True(t, strings.HasPrefix(inner.notes[0], "Deleted x: endpoint; "))
	assert.Equal(t, "50% done", inner.notes[1])
	assert.Equal(t, "100% literal, no arguments", inner.notes[2], "a note without arguments is not formatted")
	assert.LessOrEqual(t, len(inner.actions[2]), MaxActionBytes)
}
