// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestServerTextIsCleanedAndCut(t *testing.T) {
	cases := map[string]struct {
		in, want string
		maxBytes int
	}{
		"a short message is kept":                     {in: `relation "t" does not exist`, maxBytes: 200, want: `relation "t" does not exist`},
		"a message of exactly the bound is kept":      {in: strings.Repeat("a", 10), maxBytes: 10, want: strings.Repeat("a", 10)},
		"a longer message is cut and marked":          {in: strings.Repeat("a", 11), maxBytes: 10, want: strings.Repeat("a", 7) + "…"},
		"control characters become spaces":            {in: "line one\nline two\x00\x1b[31m", maxBytes: 200, want: "line one line two  [31m"},
		"invalid UTF-8 becomes a replacement":         {in: "bad \xff byte", maxBytes: 200, want: "bad \uFFFD byte"},
		"a cut never splits a character":              {in: strings.Repeat("\u044f", 10), maxBytes: 10, want: "\u044f\u044f\u044f…"},
		"the ellipsis fits within the bound when cut": {in: strings.Repeat("ab", 300), maxBytes: 200, want: strings.Repeat("ab", 98) + "a…"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := serverText(tc.in, tc.maxBytes)
			assert.Equal(t, tc.want, got)
			assert.LessOrEqual(t, len(got), tc.maxBytes)
		})
	}
}

func TestByteSizeNamesABound(t *testing.T) {
	cases := map[string]struct {
		n    int64
		want string
	}{
		"mebibytes":                         {n: 1 << 20, want: "1 MiB"},
		"kibibytes":                         {n: 64 << 10, want: "64 KiB"},
		"bytes":                             {n: 200, want: "200 bytes"},
		"no round unit falls back to bytes": {n: 1<<10 + 1, want: "1025 bytes"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, byteSize(tc.n))
		})
	}
}
