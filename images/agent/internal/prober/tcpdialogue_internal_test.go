// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMatchReply(t *testing.T) {
	prefix := func(p string) *dialogueStep { return &dialogueStep{prefix: []byte(p)} }
	re := func(r string) *dialogueStep { return &dialogueStep{re: regexp.MustCompile(r)} }
	tests := map[string]struct {
		step *dialogueStep
		got  string
		want verdict
	}{
		"nothing yet needs more":                       {step: prefix("220"), got: "", want: needMore},
		"the start of the prefix needs more":           {step: prefix("220"), got: "22", want: needMore},
		"the prefix exactly matches":                   {step: prefix("220"), got: "220", want: matched},
		"the prefix and more matches":                  {step: prefix("220"), got: "220 mail ESMTP\r\n", want: matched},
		"a first byte that differs mismatches at once": {step: prefix("220"), got: "5", want: mismatched},
		"a later byte that differs mismatches":         {step: prefix("+PONG"), got: "+PO!", want: mismatched},
		"a reply that only contains the prefix":        {step: prefix("220"), got: "554 220", want: mismatched},
		"a regex that matches inside passes":           {step: re("role:master"), got: "# Replication\r\nrole:master\r\n", want: matched},
		"a regex that does not match yet needs more":   {step: re("role:master"), got: "# Replication\r\nrole:sla", want: needMore},
		"an anchored regex on a later line needs more": {step: re("^role:master"), got: "x\r\nrole:master", want: needMore},
		"a multi-line anchored regex matches a line":   {step: re("(?m)^role:master"), got: "x\r\nrole:master", want: matched},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, matchReply(tc.step, []byte(tc.got)))
		})
	}
}

func TestQuoteReply(t *testing.T) {
	tests := map[string]struct {
		in   string
		want string
	}{
		"nothing":                                  {in: "", want: `""`},
		"control characters are escaped":           {in: "554 busy\r\n", want: `"554 busy\r\n"`},
		"invalid UTF-8 is escaped":                 {in: "\xff\x00", want: `"\xff\x00"`},
		"a reply over the bound is cut and marked": {in: strings.Repeat("a", 100), want: `"` + strings.Repeat("a", maxQuotedReplyBytes) + `"…`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, quoteReply([]byte(tc.in)))
		})
	}
}

func TestRegexpCacheIsBounded(t *testing.T) {
	var c regexpCache
	for i := range maxCachedRegexps + 10 {
		_, err := c.compile("a{" + strings.Repeat("1", 1) + "}" + strings.Repeat("b", i))
		assert.NoError(t, err)
	}
	assert.LessOrEqual(t, len(c.m), maxCachedRegexps)
	_, err := c.compile("(")
	assert.ErrorContains(t, err, "expect.regex is not an RE2 regular expression: error parsing regexp: missing closing )")
}
