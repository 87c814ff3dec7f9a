// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestCapNote: an Event note never passes MaxNote bytes (the events API refuses over 1 KiB),
// says how many parts it left out, and is whole when it fits.
func TestCapNote(t *testing.T) {
	many := make([]string, 1000)
	for i := range many {
		many[i] = fmt.Sprintf("endpoint 10.8.%d.%d (pod %q): not-ready endpoint: pod aaa-ghost-%04d does not exist", i/250, i%250, "aaa", i)
	}
	tests := []struct {
		name   string
		prefix string
		parts  []string
		want   string // a substring; "" for the whole note
	}{
		{"fits", "Deleted: ", []string{"a", "b"}, ""},
		{"a thousand parts", "Deleted: ", many, "more"},
		{"one part too long", "Deleted: ", []string{strings.Repeat("x", 2000)}, "; and 1 more"},
		{"a long prefix", strings.Repeat("p", 990), []string{"abcdefghijklmnopqrstuvwxyz"}, "; and 1 more"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := capNote(tc.prefix, tc.parts)
			assert.LessOrEqual(t, len(got), MaxNote)
			if tc.want == "" {
				assert.Equal(t, tc.prefix+strings.Join(tc.parts, "; "), got)
				return
			}
			assert.Contains(t, got, tc.want)
			assert.True(t, strings.HasPrefix(got, tc.prefix[:min(len(tc.prefix), 100)]))
		})
	}
}
