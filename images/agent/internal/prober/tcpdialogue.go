// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// The TCP dialogue (tcp.steps): after the connect, each send writes its bytes and each expect
// reads the reply until it decides, at most v1alpha1.MaxTCPExpectBytes, all within the probe's
// deadline. A server that stays silent costs the deadline; one that streams costs the bound.

// maxQuotedReplyBytes bounds how much of a reply a failure reason quotes (escaped).
const maxQuotedReplyBytes = 64

// dialogueStep is a tcp.steps entry ready to run: send decoded, or an expectation.
type dialogueStep struct {
	send   []byte
	prefix []byte         // an expect by prefix
	re     *regexp.Regexp // an expect by regular expression
}

// parseSteps decodes the sends and prefixes and compiles the regular expressions of steps. An
// error is invalid input (admission refuses it; a resource admitted before the rules existed
// may still hold it) and names the field.
func parseSteps(steps []v1alpha1.TCPStep, regexps *regexpCache) ([]dialogueStep, error) {
	if len(steps) > v1alpha1.MaxTCPSteps {
		return nil, fmt.Errorf("tcp.steps has %d entries, more than the bound of %d", len(steps), v1alpha1.MaxTCPSteps)
	}
	out := make([]dialogueStep, len(steps))
	for i, st := range steps {
		var err error
		switch {
		case (st.Send != "") == (st.Expect != nil) || st.Expect != nil && (st.Expect.Prefix != "") == (st.Expect.Regex != ""):
			err = v1alpha1.ErrTCPStepShape
		case len(st.Send) > v1alpha1.MaxTCPSendBytes:
			err = fmt.Errorf("send holds %d bytes, more than the bound of %d", len(st.Send), v1alpha1.MaxTCPSendBytes)
		case st.Send != "":
			out[i].send, err = v1alpha1.UnescapeTCP(st.Send)
		case st.Expect.Prefix != "":
			out[i].prefix, err = v1alpha1.UnescapeTCP(st.Expect.Prefix)
		default:
			out[i].re, err = regexps.compile(st.Expect.Regex)
		}
		if err != nil {
			return nil, fmt.Errorf("tcp.steps[%d]: %w", i, err)
		}
	}
	return out, nil
}

// verdict is what an expectation says of the reply read so far.
type verdict int

const (
	needMore verdict = iota // undecided: read on
	matched
	mismatched
)

// matchReply decides an expect on the reply read so far: a prefix as soon as the reply has as
// many bytes or differs from it, a regular expression as soon as it matches (never before the
// reply ends: more bytes could still match).
func matchReply(st *dialogueStep, got []byte) verdict {
	if st.re != nil {
		if st.re.Match(got) {
			return matched
		}
		return needMore
	}
	if len(got) >= len(st.prefix) {
		if bytes.HasPrefix(got, st.prefix) {
			return matched
		}
		return mismatched
	}
	if bytes.HasPrefix(st.prefix, got) {
		return needMore
	}
	return mismatched
}

// describeExpect is an expectation in words, for a reason.
func describeExpect(st *dialogueStep) string {
	if st.re != nil {
		return "a reply matching /" + serverText(st.re.String(), maxServerTextBytes) + "/"
	}
	return "a reply starting with " + quoteReply(st.prefix)
}

// quoteReply quotes bytes from the pod for a reason: Go-escaped (control characters and invalid
// UTF-8 visible), at most maxQuotedReplyBytes of them, "…" after the quote when cut.
func quoteReply(b []byte) string {
	if len(b) > maxQuotedReplyBytes {
		return strconv.Quote(string(b[:maxQuotedReplyBytes])) + "…"
	}
	return strconv.Quote(string(b))
}

// got describes the reply read so far, for a reason.
func got(b []byte) string {
	if len(b) == 0 {
		return "got nothing"
	}
	return "got " + quoteReply(b)
}

// probeTCPDialogue connects to addr and runs steps within timeout (or ctx's earlier deadline).
func (p *Prober) probeTCPDialogue(ctx context.Context, tcp *v1alpha1.TCPProbe, addr netip.AddrPort, timeout time.Duration) (Result, error) {
	steps, err := parseSteps(tcp.Steps, &p.regexps)
	if err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := dial(ctx, addr)
	if err != nil {
		return failure(netReason(ctx, err, timeout)), nil
	}
	defer func() { _ = c.Close() }() // SO_LINGER 0: a reset (probeDialer)
	deadline, _ := ctx.Deadline()
	if err := c.SetDeadline(deadline); err != nil {
		return failure(netReason(ctx, err, timeout)), nil
	}
	// ctx's end (a removed target, the agent stopping) cuts a read or write short.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	buf := replyBuffers.Get().(*[v1alpha1.MaxTCPExpectBytes]byte)
	defer replyBuffers.Put(buf)
	return runDialogue(ctx, c, steps, buf[:], timeout), nil
}

// replyBuffers hold what one expect reads; a probe takes one for its dialogue.
var replyBuffers = sync.Pool{New: func() any { return new([v1alpha1.MaxTCPExpectBytes]byte) }}

// runDialogue runs steps on c, reading each reply into buf.
func runDialogue(ctx context.Context, c net.Conn, steps []dialogueStep, buf []byte, timeout time.Duration) Result {
	for i := range steps {
		st := &steps[i]
		var reason string
		if st.send != nil {
			if _, err := c.Write(st.send); err != nil {
				reason = "sending: " + netReason(ctx, err, timeout)
			}
		} else {
			reason = expect(ctx, c, st, buf, timeout)
		}
		if reason == "" {
			continue
		}
		if len(steps) > 1 {
			reason = "step " + strconv.Itoa(i+1) + ": " + reason
		}
		return failure(reason)
	}
	if len(steps) == 1 {
		return success("replied as expected")
	}
	return success("replied as expected (" + strconv.Itoa(len(steps)) + " steps)")
}

// expect reads the reply into buf until st decides on it, and returns "" when it matched, else
// the reason: a mismatch, the bound, the end of the connection or the deadline.
func expect(ctx context.Context, c net.Conn, st *dialogueStep, buf []byte, timeout time.Duration) string {
	n := 0
	for {
		m, err := c.Read(buf[n:])
		n += m
		switch matchReply(st, buf[:n]) {
		case matched:
			return ""
		case mismatched:
			return "expected " + describeExpect(st) + ", " + got(buf[:n])
		}
		switch {
		case n == len(buf):
			return "expected " + describeExpect(st) + " within " + byteSize(int64(len(buf))) + " (the prober's limit per expect), " + got(buf[:n])
		case errors.Is(err, io.EOF):
			return "expected " + describeExpect(st) + ", " + got(buf[:n]) + " and the server closed the connection"
		case err != nil:
			return netReason(ctx, err, timeout) + ": expected " + describeExpect(st) + ", " + got(buf[:n])
		}
	}
}

// maxCachedRegexps bounds the compiled expressions a Prober keeps: the cache is emptied when
// full, so tenants who change their expressions cost a recompile, never memory.
const maxCachedRegexps = 256

// regexpCache keeps compiled expect.regex values: compiling one costs more than the rest of a
// short dialogue on loopback.
type regexpCache struct {
	mu sync.Mutex
	m  map[string]*regexp.Regexp
}

func (c *regexpCache) compile(expr string) (*regexp.Regexp, error) {
	c.mu.Lock()
	re, ok := c.m[expr]
	c.mu.Unlock()
	if ok {
		return re, nil
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, fmt.Errorf("expect.regex is not an RE2 regular expression: %w", err)
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedRegexps {
		c.m = make(map[string]*regexp.Regexp)
	}
	c.m[expr] = re
	c.mu.Unlock()
	return re, nil
}
