// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The bounds on what one probe reads from a pod. They are constants, whatever timeoutSeconds
// is: a pod controlled by a tenant must not be able to make the agent allocate more by
// answering more (development/PROBES.md, "Bounded reads"). A probe that hits one fails with a
// reason that names it.
const (
	// maxProbeReadBytes bounds everything one probe reads from its connection, TLS records and
	// PostgreSQL messages and MySQL packets included.
	maxProbeReadBytes = 1 << 20
	// maxResponseHeaderBytes bounds an HTTP response's status line and headers together, like
	// net/http's Transport.MaxResponseHeaderBytes (whose default is 10 MB; the kubelet keeps
	// that default). Real health endpoints answer with a few hundred bytes.
	maxResponseHeaderBytes = 64 << 10
	// maxBodyBytes bounds how much of a response body is read (the kubelet reads 10 KiB). The
	// rest is never read: the connection is reset instead.
	maxBodyBytes = 10 << 10
	// maxTLSHandshakeBytes bounds what the server sends during the TLS handshake (HTTPS; for
	// PostgreSQL the handshake counts towards maxProbeReadBytes). crypto/tls bounds each
	// message (64 KiB, 256 KiB for the certificate chain) and each record (16 KiB + 2 KiB),
	// not their sum; real chains are a few KiB.
	maxTLSHandshakeBytes = 64 << 10
	// maxPostgreSQLMessageBytes bounds one PostgreSQL backend message: pgproto3 allocates the
	// length a message declares before reading it, and its own default allows 1 GiB.
	maxPostgreSQLMessageBytes = 64 << 10
	// maxMySQLPacketBytes bounds one MySQL packet the server sends before TLS (or on a
	// connection without TLS): the driver allocates the length a packet declares, up to 16 MiB
	// and more for a split one, before reading it (mysqlconn.go). A probe's handshake, OK and
	// row packets are a few hundred bytes.
	maxMySQLPacketBytes = 64 << 10
	// maxServerTextBytes bounds a message the server wrote (a PostgreSQL error) quoted in a
	// reason; the rest is cut and marked with "…".
	maxServerTextBytes = 200
	// maxReasonBytes bounds every reason a probe returns: reasons become Events and status
	// text, whose sizes the API server limits.
	maxReasonBytes = 512
)

// readLimitError is returned by a limitedConn once the current bound is used up. Its reason
// names the bound; Error is the same text, so a wrapped one still says what happened.
type readLimitError struct {
	reason string
}

func (e *readLimitError) Error() string { return e.reason }

// limitReason turns an error caused by a read bound into its reason.
func limitReason(err error) (string, bool) {
	var le *readLimitError
	if errors.As(err, &le) {
		return le.reason, true
	}
	return "", false
}

// errProbeReadLimit is the error once a probe's connection delivered maxProbeReadBytes.
var errProbeReadLimit = &readLimitError{"server sent more than " + byteSize(maxProbeReadBytes) + " (the prober's limit per probe)"}

// limitedConn counts what is read from the pod's connection and refuses to read past the
// current bound (a phase such as the TLS handshake may set a lower one), whatever reads
// through it: crypto/tls, pgconn's background reader, the HTTP response reader. Reads are
// never concurrent (pgconn hands its reader over under a lock), so plain fields are enough.
type limitedConn struct {
	net.Conn
	read  int64 // bytes read so far
	limit int64 // read may reach this, no further
	err   error // returned once read == limit
}

func newLimitedConn(c net.Conn) *limitedConn {
	return &limitedConn{Conn: c, limit: maxProbeReadBytes, err: errProbeReadLimit}
}

// Read reads at most up to the current bound, then fails with the bound's error.
func (c *limitedConn) Read(p []byte) (int, error) {
	left := c.limit - c.read
	if left <= 0 {
		return 0, c.err
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	n, err := c.Conn.Read(p)
	c.read += int64(n)
	return n, err
}

// bound lowers the bound to n more bytes (never above maxProbeReadBytes in total) with its
// own error, until unbound.
func (c *limitedConn) bound(n int64, err error) {
	if c.read+n < maxProbeReadBytes {
		c.limit, c.err = c.read+n, err
	}
}

// unbound restores the per-probe bound.
func (c *limitedConn) unbound() {
	c.limit, c.err = maxProbeReadBytes, errProbeReadLimit
}

// limitedReader is io.LimitedReader with a named error instead of io.EOF once n is spent, so
// a bound is never mistaken for the end of the stream. It keeps the first error it returned:
// bufio.Reader.ReadLine hands a partial line to its caller without the error that cut it, so
// http.ReadResponse then complains about a malformed line instead of the bound or the timeout.
type limitedReader struct {
	r      io.Reader
	n      int64
	err    error
	failed error // the first error Read returned
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, l.fail(l.err)
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, l.fail(err)
}

func (l *limitedReader) fail(err error) error {
	if l.failed == nil {
		l.failed = err
	}
	return err
}

// byteSize prints a bound: "64 KiB", "1 MiB", "200 bytes".
func byteSize(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + " MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + " KiB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// serverText makes text the server chose fit for a reason: control characters and invalid
// UTF-8 become spaces and replacement characters, and it is cut to max bytes on a character
// boundary, ending with "…" when cut.
func serverText(s string, maxBytes int) string {
	var b strings.Builder
	// Ranging over a string yields utf8.RuneError (U+FFFD) for every invalid byte.
	for _, r := range s {
		if unicode.IsControl(r) {
			r = ' '
		}
		if b.Len()+utf8.RuneLen(r) > maxBytes {
			// Leave room for the ellipsis (3 bytes) within max.
			out := b.String()
			for len(out) > 0 && len(out)+len("…") > maxBytes {
				_, size := utf8.DecodeLastRuneInString(out)
				out = out[:len(out)-size]
			}
			return out + "…"
		}
		b.WriteRune(r)
	}
	return b.String()
}
