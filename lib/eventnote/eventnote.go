// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package eventnote keeps the Events of both programs within what the events API accepts and
// apart from each other:
//
//   - a note is at most MaxBytes (the events API refuses a longer one, and the Event is lost):
//     Cap cuts one at a rune boundary, Join lists items and counts those that do not fit
//     ("and N more"), and Recorder caps every note a recorder writes, whoever formats it;
//   - an action is at most MaxActionBytes, and Action keys it with what tells two notes apart:
//     client-go's events broadcaster merges Events of the same type, action, reason, regarding
//     and related object into one series that keeps the first note, so an Event whose note says
//     something new must differ from the earlier one in its action (v0.2.0 did this for
//     PortNotReady with Probe/<port>).
package eventnote

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
)

const (
	// MaxBytes is the longest note the events API accepts (events.k8s.io/v1 note: 1 KiB).
	MaxBytes = 1024
	// MaxActionBytes is the longest action the events API accepts.
	MaxActionBytes = 128
	// ellipsis ends a note that was cut.
	ellipsis = "…"
	// digestLength is how many hex characters of a key's SHA-256 stand for a key that does not
	// fit an action.
	digestLength = 16
)

// Cap cuts s to MaxBytes at a rune boundary, ending it with "…" when cut.
func Cap(s string) string {
	return CapTo(s, MaxBytes)
}

// CapTo cuts s to at most limit bytes at a rune boundary, ending it with "…" when cut (a limit
// too small for the ellipsis cuts without one).
func CapTo(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	if limit < len(ellipsis) {
		return cutAtRune(s, max(limit, 0))
	}
	return cutAtRune(s, limit-len(ellipsis)) + ellipsis
}

// cutAtRune is s cut to at most n bytes, on a rune boundary.
func cutAtRune(s string, n int) string {
	for n > 0 && n < len(s) && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Join is head followed by the items joined with sep, within limit bytes: the items that do not
// fit are left out and counted, " and N more" at the end. At least one item is listed when the
// head leaves room for anything: a first item too long for the room left is cut ("…"). With no
// items Join is head.
func Join(head string, items []string, sep string, limit int) string {
	if len(items) == 0 {
		return CapTo(head, limit)
	}
	var b strings.Builder
	b.WriteString(head)
	for i, item := range items {
		part := item
		if i > 0 {
			part = sep + item
		}
		rest := len(items) - i - 1
		more := ""
		if rest > 0 {
			more = " and " + strconv.Itoa(rest) + " more"
		}
		if b.Len()+len(part)+len(more) <= limit {
			b.WriteString(part)
			continue
		}
		if i == 0 {
			// The first item alone is too long: cut it, so the note says at least something of it.
			room := limit - b.Len() - len(" and "+strconv.Itoa(len(items)-1)+" more")
			if len(items) == 1 {
				room = limit - b.Len()
			}
			if room > len(ellipsis) {
				b.WriteString(CapTo(item, room))
				if len(items) > 1 {
					b.WriteString(" and " + strconv.Itoa(len(items)-1) + " more")
				}
				return b.String()
			}
		}
		return CapTo(b.String()+" and "+strconv.Itoa(len(items)-i)+" more", limit)
	}
	return b.String()
}

// Action is base, then "/" and the parts joined with "/": the action of an Event whose notes
// differ by the parts. When that is longer than MaxActionBytes, the parts are replaced by a
// digest of them, so that different parts still give different actions.
func Action(base string, parts ...string) string {
	if len(parts) == 0 {
		return base
	}
	key := strings.Join(parts, "/")
	if a := base + "/" + key; len(a) <= MaxActionBytes {
		return a
	}
	sum := sha256.Sum256([]byte(key))
	return CapTo(base, MaxActionBytes-1-digestLength) + "/" + hex.EncodeToString(sum[:])[:digestLength]
}

// Recorder is an events.EventRecorder whose notes are at most MaxBytes: a note formatted
// longer (a list of many items, a reason an attacker wrote) is cut, so the events API does not
// refuse the Event.
type Recorder struct {
	events.EventRecorder
}

// Capped wraps r so that every note it records is capped (Cap).
func Capped(r events.EventRecorder) Recorder {
	return Recorder{EventRecorder: r}
}

// Eventf records the Event with its note formatted and capped.
func (r Recorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	if len(args) > 0 {
		note = fmt.Sprintf(note, args...)
	}
	r.EventRecorder.Eventf(regarding, related, eventtype, reason, CapTo(action, MaxActionBytes), "%s", Cap(note))
}
