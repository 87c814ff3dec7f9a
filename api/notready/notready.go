// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package notready is the note an agent leaves on each EndpointSlice it publishes about why the
// slice's not-ready endpoints are out (development/AGENT.md, "Why a pod is out"), and its
// reading by the controller, which copies it into status.ports[].notReady (DESIGN §6: the status
// has one writer, the agent only reports).
//
// The note holds reasons only, by pod name: which pods are out, and on which node, the
// controller reads from the slices' endpoints themselves, which it audits. So a note can add
// nothing but the text of a reason to a pod that a slice the controller accepted already
// lists as not ready; a name in the note that no such endpoint carries is ignored.
package notready

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// Annotation on an EndpointSlice of this module holds the Note (absent: no reason recorded,
// for instance no endpoint of the slice is out).
const Annotation = "network.deckhouse.io/not-ready-reasons"

// MaxPods bounds the pods one Note names: the first MaxPods of the slice's not-ready pods by
// name. The controller lists the first MaxPods pods of a port by name too, and those are among
// the first MaxPods of every slice they are in, so no listed pod lacks its reason for the cap.
const MaxPods = v1alpha1.MaxNotReadyPerPort

// MaxReasonBytes bounds a reason, in bytes (of UTF-8, so also in characters): longer ones are
// cut at a character boundary and end with "…".
const MaxReasonBytes = v1alpha1.MaxNotReadyReason

// MaxAnnotationBytes bounds the annotation's value: the agents' admission policy refuses a
// slice whose note is longer, and the controller ignores one. MaxPods names of at most 253
// bytes and reasons of MaxReasonBytes (JSON escapes at most double a reason: control characters
// are replaced before encoding, HTML characters are not escaped) with the JSON around them take
// less than 8 KiB.
const MaxAnnotationBytes = 16384

// Note is the reasons of a slice's not-ready pods, by pod name.
type Note map[string]string

// Encode is the annotation value of the reasons of a slice's not-ready pods (by pod name): the
// first MaxPods names in order, each reason Sanitized; "" for none. The value is compact JSON,
// {"pod-a":"reason","pod-b":"reason"}, keys sorted, so equal notes encode equally.
func Encode(reasons map[string]string) string {
	if len(reasons) == 0 {
		return ""
	}
	kept := firstSanitized(slices.Collect(maps.Keys(reasons)), reasons)
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(kept); err != nil {
		// Plain strings: this cannot happen.
		return ""
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// Parse reads an annotation value ("" is an empty Note). A value longer than MaxAnnotationBytes
// or not a JSON object of strings is an error (the caller shows no reason from it); a valid one
// keeps its first MaxPods names, each reason Sanitized, and drops names that are not pod names'
// length.
func Parse(value string) (Note, error) {
	if value == "" {
		return Note{}, nil
	}
	if len(value) > MaxAnnotationBytes {
		return nil, fmt.Errorf("the %s annotation is %d bytes, more than %d", Annotation, len(value), MaxAnnotationBytes)
	}
	var raw map[string]string
	if err := json.Unmarshal([]byte(value), &raw); err != nil {
		return nil, fmt.Errorf("reading the %s annotation: %w", Annotation, err)
	}
	names := make([]string, 0, len(raw))
	for n := range raw {
		if n != "" && len(n) <= maxPodName {
			names = append(names, n)
		}
	}
	return firstSanitized(names, raw), nil
}

// firstSanitized is the Note of the first MaxPods of names in sorted order (names is sorted in
// place), each with its reason Sanitized.
func firstSanitized(names []string, reasons map[string]string) Note {
	slices.Sort(names)
	names = names[:min(len(names), MaxPods)]
	out := make(Note, len(names))
	for _, n := range names {
		out[n] = Sanitize(reasons[n])
	}
	return out
}

// maxPodName is the longest object name (a DNS subdomain).
const maxPodName = 253

// Sanitize makes a reason fit for a status and a terminal: valid UTF-8 (invalid bytes become
// U+FFFD), every control character a space, surrounding space trimmed, at most MaxReasonBytes
// (cut at a character boundary, ending with "…").
func Sanitize(reason string) string {
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(reason, "\uFFFD") {
		if b.Len() > 4*MaxReasonBytes {
			break
		}
		if unicode.IsControl(r) {
			r = ' '
		}
		b.WriteRune(r)
	}
	return Cap(strings.TrimSpace(b.String()), MaxReasonBytes)
}

// Cap cuts s to at most n bytes at a character boundary, ending it with "…" when cut.
func Cap(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "…"
	cut := n - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
