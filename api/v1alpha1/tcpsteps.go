// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	"errors"
	"fmt"
	"regexp"
)

// The bounds of a TCP dialogue (tcp.steps). The CRD's markers repeat the numbers (markers cannot
// name constants); testkit/crd checks each is the exact edge of what the API server admits.
const (
	// MaxTCPSteps bounds tcp.steps: a banner, or a command and its reply, with room to spare.
	MaxTCPSteps = 8
	// MaxTCPSendBytes bounds a send step as written, in UTF-8 bytes (an escape counts as
	// written): what it sends after decoding is never more. A byte-size rule is what the API
	// server's CEL cost budget allows for 32 probes of 8 steps; decoding the escapes in CEL
	// (findAll) is seven times over it.
	MaxTCPSendBytes = 1024
	// MaxTCPPrefixLength bounds expect.prefix as written, in characters.
	MaxTCPPrefixLength = 1024
	// MaxTCPRegexLength bounds expect.regex, in characters.
	MaxTCPRegexLength = 512
	// MaxTCPExpectBytes bounds what one expect step reads from the pod: it fails when the reply
	// has not matched within that many bytes. Replies that decide health (a banner, +PONG, Redis'
	// INFO replication) are a few hundred bytes.
	MaxTCPExpectBytes = 4096
)

// UnescapeTCP decodes the escapes of a send step or an expect prefix: \r, \n, \t, \\ and \xHH
// (one byte in two hex digits). Every other character stands for its UTF-8 bytes. A backslash
// that starts no escape is an error naming it and its position.
func UnescapeTCP(s string) ([]byte, error) {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		if i+1 == len(s) {
			return nil, fmt.Errorf("a backslash at the end (character %d) starts no escape; write \\\\ for a backslash", i+1)
		}
		switch s[i+1] {
		case 'r':
			out = append(out, '\r')
		case 'n':
			out = append(out, '\n')
		case 't':
			out = append(out, '\t')
		case '\\':
			out = append(out, '\\')
		case 'x':
			if i+3 >= len(s) || !isHex(s[i+2]) || !isHex(s[i+3]) {
				return nil, fmt.Errorf("%q (character %d) is not an escape: \\x takes two hex digits, e.g. \\x00", escapeAt(s, i), i+1)
			}
			out = append(out, unhex(s[i+2])<<4|unhex(s[i+3]))
			i += 2
		default:
			return nil, fmt.Errorf("%q (character %d) is not an escape: use \\r, \\n, \\t, \\\\ or \\xHH", escapeAt(s, i), i+1)
		}
		i++
	}
	return out, nil
}

// escapeAt is the (bad) escape starting at s[i], for a message: at most four bytes.
func escapeAt(s string, i int) string {
	end := i + 4
	if end > len(s) {
		end = len(s)
	}
	return s[i:end]
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// ErrTCPStepShape is the error of a step that sets neither or both of send and expect, or an
// expect that sets neither or both of prefix and regex.
var ErrTCPStepShape = errors.New("each step must set exactly one of send and expect, each expect exactly one of prefix and regex")

// CheckTCPSteps checks steps as admission does (each error names its field below tcp.steps,
// e.g. "steps[1].expect.regex ..."): the shapes, the escapes, the send size and the regular
// expressions. The controller reports what it finds in SpecOutOfBounds; the prober refuses to
// run such a dialogue.
func CheckTCPSteps(steps []TCPStep) []error {
	var errs []error
	if len(steps) > MaxTCPSteps {
		errs = append(errs, fmt.Errorf("steps has %d entries, more than the bound of %d", len(steps), MaxTCPSteps))
	}
	for i, st := range steps {
		field := fmt.Sprintf("steps[%d]", i)
		if (st.Send != "") == (st.Expect != nil) || st.Expect != nil && (st.Expect.Prefix != "") == (st.Expect.Regex != "") {
			errs = append(errs, fmt.Errorf("%s: %w", field, ErrTCPStepShape))
			continue
		}
		if st.Send != "" {
			if len(st.Send) > MaxTCPSendBytes {
				errs = append(errs, fmt.Errorf("%s.send holds %d bytes, more than the bound of %d", field, len(st.Send), MaxTCPSendBytes))
			}
			if _, err := UnescapeTCP(st.Send); err != nil {
				errs = append(errs, fmt.Errorf("%s.send: %w", field, err))
			}
			continue
		}
		if st.Expect.Prefix != "" {
			if _, err := UnescapeTCP(st.Expect.Prefix); err != nil {
				errs = append(errs, fmt.Errorf("%s.expect.prefix: %w", field, err))
			}
			continue
		}
		if _, err := regexp.Compile(st.Expect.Regex); err != nil {
			errs = append(errs, fmt.Errorf("%s.expect.regex is not an RE2 regular expression: %w", field, err))
		}
	}
	return errs
}
