// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package crd_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// tcpSteps is a resource whose one TCP probe holds steps (a list of step maps), as values:
// send texts hold backslashes and control characters that YAML would make hard to read.
func tcpSteps(ns, name string, steps ...map[string]any) *unstructured.Unstructured {
	list := make([]any, len(steps))
	for i, s := range steps {
		list[i] = s
	}
	return objectWithSpec(ns, name, map[string]any{
		"ports":    []any{map[string]any{"name": "smtp", "port": int64(25)}},
		"selector": map[string]any{"app": "mail"},
		"healthcheck": map[string]any{"probes": []any{map[string]any{
			"mode": "TCP",
			"tcp":  map[string]any{"targetPort": int64(25), "steps": list},
		}}},
	})
}

func send(s string) map[string]any { return map[string]any{"send": s} }

func expectPrefix(s string) map[string]any {
	return map[string]any{"expect": map[string]any{"prefix": s}}
}

func expectRegex(s string) map[string]any {
	return map[string]any{"expect": map[string]any{"regex": s}}
}

// repeatSteps is n copies of step.
func repeatSteps(n int, step map[string]any) []map[string]any {
	out := make([]map[string]any, n)
	for i := range out {
		out[i] = step
	}
	return out
}

func TestTCPStepsThatBreakARuleAreRefusedWithAClearMessage(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "crd-tcp-steps-invalid")
	tests := map[string]struct {
		steps []map[string]any
		want  []string
	}{
		"nine steps": {
			steps: repeatSteps(v1alpha1.MaxTCPSteps+1, send("x")),
			want:  []string{"tcp.steps may hold at most 8 steps (sends and expects together)"},
		},
		"a step with both send and expect": {
			steps: []map[string]any{{"send": "PING\r\n", "expect": map[string]any{"prefix": "+PONG"}}},
			want:  []string{"each tcp.steps entry must set exactly one of send (bytes the probe writes) and expect (what the server must answer)"},
		},
		"a step with neither send nor expect": {
			steps: []map[string]any{{}},
			want:  []string{"each tcp.steps entry must set exactly one of send"},
		},
		"an expect with both prefix and regex": {
			steps: []map[string]any{{"expect": map[string]any{"prefix": "220", "regex": "^220"}}},
			want:  []string{"tcp.steps[].expect must set exactly one of prefix (the reply starts with these bytes) and regex"},
		},
		"an expect with neither prefix nor regex": {
			steps: []map[string]any{{"expect": map[string]any{}}},
			want:  []string{"tcp.steps[].expect must set exactly one of prefix"},
		},
		"an empty send": {
			steps: []map[string]any{send("")},
			want:  []string{"send in body should be at least 1 chars long"},
		},
		"a send with an unknown escape": {
			steps: []map[string]any{send(`PING\q`)},
			want:  []string{`tcp.steps[].send: a backslash must start an escape: \r, \n, \t, \\ (a backslash) or \xHH`},
		},
		"a send with a hex escape of one digit": {
			steps: []map[string]any{send(`\x4`)},
			want:  []string{`tcp.steps[].send: a backslash must start an escape`},
		},
		"a send that ends with a backslash": {
			steps: []map[string]any{send(`PING\`)},
			want:  []string{`tcp.steps[].send: a backslash must start an escape`},
		},
		"a prefix with an unknown escape": {
			steps: []map[string]any{expectPrefix(`220\d`)},
			want:  []string{`tcp.steps[].expect.prefix: a backslash must start an escape`},
		},
		"a send of 1025 characters": {
			steps: []map[string]any{send(strings.Repeat("a", v1alpha1.MaxTCPSendBytes+1))},
			want:  []string{"Too long: may not be more than 1024"},
		},
		"a send of 513 two-byte characters (1026 bytes)": {
			steps: []map[string]any{send(strings.Repeat("é", v1alpha1.MaxTCPSendBytes/2+1))},
			want:  []string{"tcp.steps[].send may hold at most 1024 bytes as written (UTF-8; an escape counts as written"},
		},
		"a regex with an unclosed group": {
			steps: []map[string]any{expectRegex("role:(master")},
			want: []string{
				"error parsing regexp: missing closing ): `role:(master`",
				"tcp.steps[].expect.regex must be an RE2 regular expression (Go's regexp syntax: no backreferences or lookaround)",
			},
		},
		"a regex with a lookahead, which RE2 does not have": {
			steps: []map[string]any{expectRegex("role:(?=master)")},
			want:  []string{"invalid or unsupported Perl syntax", "tcp.steps[].expect.regex must be an RE2 regular expression"},
		},
		"a regex with a backreference": {
			steps: []map[string]any{expectRegex(`(a)\1`)},
			want:  []string{"invalid escape sequence", "tcp.steps[].expect.regex must be an RE2 regular expression"},
		},
		"a regex longer than its bound": {
			steps: []map[string]any{expectRegex(strings.Repeat("a", v1alpha1.MaxTCPRegexLength+1))},
			want:  []string{"Too long: may not be more than 512"},
		},
	}
	i := 0
	for name, tc := range tests {
		i++
		t.Run(name, func(t *testing.T) {
			err := env.Client.Create(t.Context(), tcpSteps(ns, fmt.Sprintf("bad-%d", i), tc.steps...), client.DryRunAll)
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestTCPDialoguesOperatorsWriteAreAccepted(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "crd-tcp-steps-valid")
	tests := map[string][]map[string]any{
		"Redis PING and +PONG, escapes as written in single quotes": {send(`PING\r\n`), expectPrefix(`+PONG\r\n`)},
		"Redis PING with the CR LF YAML decodes in double quotes":   {send("PING\r\n"), expectPrefix("+PONG")},
		"Redis role:master, quitting so the server closes":          {send(`INFO replication\r\nQUIT\r\n`), expectRegex(`(?m)^role:master\r?$`)},
		"an SMTP banner":                         {expectPrefix("220")},
		"an SMTP banner, then a command":         {expectPrefix("220"), send(`EHLO probe\r\n`), expectRegex(`^250[ -]`), send(`QUIT\r\n`)},
		"a binary greeting in hex escapes":       {send(`\x00\x01\xff\\`), expectPrefix(`\x00`)},
		"eight steps":                            repeatSteps(v1alpha1.MaxTCPSteps, send("x")),
		"a send of 256 hex escapes (1024 bytes)": {send(strings.Repeat(`\x41`, v1alpha1.MaxTCPSendBytes/4))},
		"a send of 512 two-byte characters":      {send(strings.Repeat("é", v1alpha1.MaxTCPSendBytes/2))},
		"a send of exactly 1024 bytes":           {send(strings.Repeat("a", v1alpha1.MaxTCPSendBytes))},
		"a regex of exactly its bound":           {expectRegex(strings.Repeat("a", v1alpha1.MaxTCPRegexLength))},
		"a prefix of exactly its bound":          {expectPrefix(strings.Repeat("a", v1alpha1.MaxTCPPrefixLength))},
		"a prefix with a tab and a backslash":    {expectPrefix(`a\tb\\c`)},
		"a regex with RE2 classes and repeats":   {expectRegex(`^\+PONG|connected_slaves:[1-9][0-9]{0,3}`)},
	}
	i := 0
	for name, steps := range tests {
		i++
		t.Run(name, func(t *testing.T) {
			require.NoError(t, env.Client.Create(t.Context(), tcpSteps(ns, fmt.Sprintf("ok-%d", i), steps...), client.DryRunAll))
			assert.Empty(t, v1alpha1.CheckTCPSteps(toSteps(steps)), "the controller and the prober accept what admission accepts")
		})
	}
}

// The controller reports (SpecOutOfBounds) and the prober refuses to run what CheckTCPSteps
// finds, so it must refuse exactly what the API server refuses.
func TestCheckTCPStepsAgreesWithAdmission(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "crd-tcp-steps-agree")
	candidates := map[string][]map[string]any{
		"a valid dialogue":             {expectPrefix("220"), send(`QUIT\r\n`)},
		"an escape of a backslash":     {send(`a\\qb`)},
		"an unknown escape":            {send(`a\qb`)},
		"an upper-case hex escape":     {send(`\xFF`)},
		"a hex escape with a non-hex":  {send(`\xG0`)},
		"a trailing backslash":         {expectPrefix(`a\`)},
		"a double trailing backslash":  {expectPrefix(`a\\`)},
		"a regex with a bad repeat":    {expectRegex(`a**`)},
		"a regex with a huge repeat":   {expectRegex(`a{1001}`)},
		"a regex with a named group":   {expectRegex(`(?P<role>master)`)},
		"a regex with a bad class":     {expectRegex(`[z-a]`)},
		"a regex with a Unicode class": {expectRegex(`\p{Greek}`)},
		"a send of 1024 bytes":         {send(strings.Repeat(`\n`, v1alpha1.MaxTCPSendBytes/2))},
		"a send of 1025 bytes":         {send(strings.Repeat("é", v1alpha1.MaxTCPSendBytes/2) + "x")},
		"both send and expect":         {{"send": "x", "expect": map[string]any{"regex": "x"}}},
	}
	var admitted, refused int
	i := 0
	for name, steps := range candidates {
		i++
		t.Run(name, func(t *testing.T) {
			err := env.Client.Create(t.Context(), tcpSteps(ns, fmt.Sprintf("agree-%d", i), steps...), client.DryRunAll)
			found := v1alpha1.CheckTCPSteps(toSteps(steps))
			assert.Equal(t, err == nil, len(found) == 0, "admission %v, CheckTCPSteps %v", err, found)
			if err != nil {
				refused++
			} else {
				admitted++
			}
		})
	}
	assert.Positive(t, admitted, "some candidates are admitted")
	assert.Positive(t, refused, "some candidates are refused")
}

// toSteps turns step maps into the API type.
func toSteps(steps []map[string]any) []v1alpha1.TCPStep {
	out := make([]v1alpha1.TCPStep, len(steps))
	for i, s := range steps {
		if v, ok := s["send"].(string); ok {
			out[i].Send = v
		}
		if e, ok := s["expect"].(map[string]any); ok {
			out[i].Expect = &v1alpha1.TCPExpect{}
			out[i].Expect.Prefix, _ = e["prefix"].(string)
			out[i].Expect.Regex, _ = e["regex"].(string)
		}
	}
	return out
}
