// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

func TestUnescapeTCP(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    string
		wantErr string
	}{
		"plain text is its bytes":                    {in: "PING", want: "PING"},
		"CR LF escapes":                              {in: `PING\r\n`, want: "PING\r\n"},
		"a tab escape":                               {in: `a\tb`, want: "a\tb"},
		"an escaped backslash":                       {in: `a\\b`, want: `a\b`},
		"an escaped backslash before an n":           {in: `\\n`, want: `\n`},
		"hex escapes in both cases":                  {in: `\x00\xff\xAB`, want: "\x00\xff\xab"},
		"real control characters pass as they are":   {in: "PING\r\n", want: "PING\r\n"},
		"UTF-8 characters are their bytes":           {in: "é", want: "\xc3\xa9"},
		"an unknown escape is refused":               {in: `PING\q`, wantErr: `"\\q" (character 5) is not an escape`},
		"a hex escape with one digit is refused":     {in: `\x4`, wantErr: `\x takes two hex digits`},
		"a hex escape with a non-hex is refused":     {in: `\x4g`, wantErr: `"\\x4g" (character 1) is not an escape`},
		"a backslash at the end is refused":          {in: `PING\`, wantErr: "a backslash at the end (character 5) starts no escape"},
		"an escaped backslash at the end is allowed": {in: `a\\`, want: `a\`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := v1alpha1.UnescapeTCP(tc.in)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(got))
		})
	}
}

func TestCheckTCPSteps(t *testing.T) {
	tests := map[string]struct {
		steps []v1alpha1.TCPStep
		want  []string
	}{
		"a banner and a command": {steps: []v1alpha1.TCPStep{
			{Expect: &v1alpha1.TCPExpect{Prefix: "220"}}, {Send: `QUIT\r\n`}, {Expect: &v1alpha1.TCPExpect{Regex: "^221"}}}},
		"nine steps": {steps: make9(), want: []string{"steps has 9 entries, more than the bound of 8"}},
		"a step with send and expect": {steps: []v1alpha1.TCPStep{{Send: "x", Expect: &v1alpha1.TCPExpect{Prefix: "y"}}},
			want: []string{"steps[0]: each step must set exactly one of send and expect"}},
		"an expect with prefix and regex": {steps: []v1alpha1.TCPStep{{Expect: &v1alpha1.TCPExpect{Prefix: "y", Regex: "y"}}},
			want: []string{"steps[0]: each step must set exactly one of send and expect, each expect exactly one of prefix and regex"}},
		"a bad escape and a bad regex": {steps: []v1alpha1.TCPStep{{Send: `\q`}, {Expect: &v1alpha1.TCPExpect{Regex: "("}}},
			want: []string{`steps[0].send: "\\q" (character 1) is not an escape`, "steps[1].expect.regex is not an RE2 regular expression: error parsing regexp: missing closing ): `(`"}},
		"a send over its bound": {steps: []v1alpha1.TCPStep{{Send: strings.Repeat("a", v1alpha1.MaxTCPSendBytes+1)}},
			want: []string{"steps[0].send holds 1025 bytes, more than the bound of 1024"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			errs := v1alpha1.CheckTCPSteps(tc.steps)
			got := make([]string, len(errs))
			for i, e := range errs {
				got[i] = e.Error()
			}
			require.Len(t, got, len(tc.want), "%q", got)
			for i := range tc.want {
				assert.Contains(t, got[i], tc.want[i])
			}
		})
	}
}

func make9() []v1alpha1.TCPStep {
	out := make([]v1alpha1.TCPStep, v1alpha1.MaxTCPSteps+1)
	for i := range out {
		out[i].Send = "x"
	}
	return out
}
