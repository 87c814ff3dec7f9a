// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// userAgent is sent unless the probe sets its own User-Agent header.
const userAgent = "service-with-healthchecks-agent"

// probeHTTP sends one request on a fresh connection to the pod's IP and judges the status code.
// It does not use http.Client: no connection pool to keep, no redirect to follow, and the Host
// header and TLS server name come from the probe while the dial target is always addr.
func (p *Prober) probeHTTP(ctx context.Context, h *v1alpha1.HTTPProbe, addr netip.AddrPort, timeout time.Duration) (Result, error) {
	if err := validateStatusCodes(h.SuccessStatusCodes); err != nil {
		return Result{}, err
	}
	method := h.Method
	switch strings.ToUpper(method) {
	case "", http.MethodGet:
		method = http.MethodGet
	case http.MethodHead:
		method = http.MethodHead
	default:
		return Result{}, fmt.Errorf("http.method %q: only GET and HEAD are allowed", h.Method)
	}
	path := h.Path
	if path == "" {
		path = "/"
	}
	u, err := url.ParseRequestURI(path)
	if err != nil || !strings.HasPrefix(path, "/") {
		return Result{}, fmt.Errorf("http.path %q is not an absolute path", h.Path)
	}
	var https bool
	switch strings.ToUpper(string(h.Scheme)) {
	case "", "HTTP":
	case "HTTPS":
		https = true
	default:
		return Result{}, fmt.Errorf("http.scheme %q: only HTTP and HTTPS are allowed", h.Scheme)
	}

	req := &http.Request{
		Method:     method,
		URL:        u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     make(http.Header, len(h.HTTPHeaders)+2),
		Host:       h.Host,
		Close:      true,
	}
	for _, hdr := range h.HTTPHeaders {
		if strings.EqualFold(hdr.Name, "Host") {
			if req.Host == "" {
				req.Host = hdr.Value
			}
			continue
		}
		req.Header.Add(hdr.Name, hdr.Value)
	}
	if req.Host == "" {
		// The dial target, as the kubelet sends it: "10.0.0.1:8080", "[2001:db8::1]:8080".
		req.Host = addr.String()
	}
	req.Host = bracketIPv6(req.Host)
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{userAgent}
	}
	if _, ok := req.Header["Accept"]; !ok {
		req.Header["Accept"] = []string{"*/*"}
	}

	var tlsConfig *tls.Config
	if https {
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: h.InsecureSkipTLSVerify} //nolint:gosec // Opt-in per probe.
		// The server name is the probe's host; without one the certificate must name the pod IP.
		// An IP literal (the pod's, or a host that is one) is sent as no server name at all
		// (crypto/tls leaves SNI out for one, as RFC 6066 asks) and checked against the
		// certificate's IP SANs; it is given without brackets.
		if h.Host != "" {
			tlsConfig.ServerName = hostOnly(h.Host)
		} else {
			tlsConfig.ServerName = addr.Addr().String()
		}
		if h.CACert != "" {
			pool, err := caPool(h.CACert)
			if err != nil {
				return Result{}, fmt.Errorf("http.caCert: %w", err)
			}
			tlsConfig.RootCAs = pool
		}
	}

	tcp, err := dial(ctx, addr)
	if err != nil {
		return failure(netReason(ctx, err, timeout)), nil
	}
	defer func() { _ = tcp.Close() }()
	if deadline, ok := ctx.Deadline(); ok {
		_ = tcp.SetDeadline(deadline)
	}
	// A cancelled ctx (not only its deadline) must also interrupt reads and writes.
	stop := context.AfterFunc(ctx, func() { _ = tcp.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	// Every byte read from the pod goes through conn, which bounds the whole probe and, during
	// the handshake, the handshake.
	conn := newLimitedConn(tcp)
	var rw net.Conn = conn
	if tlsConfig != nil {
		tc := tls.Client(conn, tlsConfig)
		conn.bound(maxTLSHandshakeBytes, errTLSHandshakeLimit)
		if err := tc.HandshakeContext(ctx); err != nil {
			return failure(tlsReason(ctx, err, timeout)), nil
		}
		conn.unbound()
		rw = tc
	}
	if err := writeRequest(req, rw); err != nil {
		return failure("sending request: " + netReason(ctx, err, timeout)), nil
	}
	// The status line and headers are read through a bound of their own: http.ReadResponse
	// reads them without any limit (an endless header line would take the agent's memory).
	// The bufio.Reader sits above the bound, so what it reads ahead counts too.
	head := &limitedReader{r: rw, n: maxResponseHeaderBytes, err: errResponseHeaderLimit}
	br := probeReaders.Get().(*bufio.Reader)
	br.Reset(head)
	defer func() {
		br.Reset(nil)
		probeReaders.Put(br)
	}()
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		if head.failed != nil {
			// The read error that cut the response short is the reason, not the partial line
			// it left behind ("malformed MIME header").
			err = head.failed
		}
		if reason, ok := limitReason(err); ok {
			return failure(reason), nil
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return failure("connection closed before a response"), nil
		}
		return failure("reading response: " + netReason(ctx, err, timeout)), nil
	}
	// Read a bounded part of the body so a small response is consumed; a large or slow body
	// does not change the verdict, which is the status code. What the bufio.Reader holds was
	// counted as headers, so at most maxBodyBytes more are read from the connection.
	head.n, head.err = maxBodyBytes, io.EOF
	_, _ = io.CopyN(io.Discard, resp.Body, maxBodyBytes)
	reason := "HTTP " + strconv.Itoa(resp.StatusCode)
	if statusPasses(resp.StatusCode, h.SuccessStatusCodes) {
		return success(reason), nil
	}
	return failure(reason), nil
}

// The buffers of HTTP probes, reused from probe to probe: allocated for each one, the reader's
// and the writer's 4 KiB were more than half of an HTTP probe's garbage, which at thousands of
// probes a second sets the pace of the agent's garbage collector (development/BENCHMARKS.md,
// "HTTP probe buffers"). A buffer returns to its pool reset: nothing of one pod's answer can
// be read by the next probe.
var (
	probeReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4<<10) }}
	probeWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4<<10) }}
)

// writeRequest writes req to w through a pooled buffer: Request.Write buffers only a writer
// that is not one already, so handing it a bufio.Writer spares it its own.
func writeRequest(req *http.Request, w io.Writer) error {
	bw := probeWriters.Get().(*bufio.Writer)
	bw.Reset(w)
	defer func() {
		bw.Reset(nil)
		probeWriters.Put(bw)
	}()
	if err := req.Write(bw); err != nil {
		return err
	}
	return bw.Flush()
}

// The bounds of an HTTP probe, as failure reasons.
var (
	errResponseHeaderLimit = &readLimitError{"response status line and headers exceed " + byteSize(maxResponseHeaderBytes) + " (the prober's limit)"}
	errTLSHandshakeLimit   = &readLimitError{"TLS: handshake exceeds " + byteSize(maxTLSHandshakeBytes) + " (the prober's limit)"}
)

// hostOnly strips a :port, and the brackets of an IPv6 literal, from a Host value:
// "example.org:8443" -> "example.org", "[2001:db8::1]:8443" and "[2001:db8::1]" ->
// "2001:db8::1".
func hostOnly(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		return h
	}
	if len(host) > 2 && host[0] == '[' && host[len(host)-1] == ']' {
		return host[1 : len(host)-1]
	}
	return host
}

// bracketIPv6 writes a Host value that is a bare IPv6 literal ("2001:db8::1", which a server
// would read as a host and a port) in brackets, as RFC 9110 and RFC 3986 ask: "[2001:db8::1]".
// Names, IPv4 addresses and values with a port are kept.
func bracketIPv6(host string) string {
	if a, err := netip.ParseAddr(host); err == nil && a.Is6() {
		return "[" + host + "]"
	}
	return host
}

// statusPasses applies the status rule: 200-399 like the kubelet, or, when successStatusCodes
// is set, exactly the listed codes and ranges. The list was validated before.
func statusPasses(code int, list []string) bool {
	if len(list) == 0 {
		return code >= 200 && code < 400
	}
	for _, e := range list {
		lo, hi, _ := parseCodeRange(e)
		if code >= lo && code <= hi {
			return true
		}
	}
	return false
}

func validateStatusCodes(list []string) error {
	for _, e := range list {
		if _, _, err := parseCodeRange(e); err != nil {
			return fmt.Errorf("http.successStatusCodes: %w", err)
		}
	}
	return nil
}

// parseCodeRange parses "418" or "400-404" without allocating.
func parseCodeRange(e string) (lo, hi int, err error) {
	a, b, isRange := strings.Cut(e, "-")
	lo, err = parseCode(a)
	if err != nil {
		return 0, 0, fmt.Errorf("%q: %w", e, err)
	}
	hi = lo
	if isRange {
		if hi, err = parseCode(b); err != nil {
			return 0, 0, fmt.Errorf("%q: %w", e, err)
		}
		if hi < lo {
			return 0, 0, fmt.Errorf("%q: range is descending", e)
		}
	}
	return lo, hi, nil
}

var errBadCode = errors.New("not a status code from 100 to 599")

func parseCode(s string) (int, error) {
	if len(s) != 3 {
		return 0, errBadCode
	}
	n := 0
	for i := 0; i < 3; i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, errBadCode
		}
		n = n*10 + int(c-'0')
	}
	if n < 100 || n > 599 {
		return 0, errBadCode
	}
	return n, nil
}

// caPools caches parsed caCert PEMs: probes repeat every period with the same PEM.
var caPools = struct {
	sync.Mutex
	m map[string]*x509.CertPool
}{m: map[string]*x509.CertPool{}}

const maxCachedCAs = 256

func caPool(pemData string) (*x509.CertPool, error) {
	caPools.Lock()
	defer caPools.Unlock()
	if pool, ok := caPools.m[pemData]; ok {
		return pool, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(pemData)) {
		return nil, errors.New("no PEM certificate found")
	}
	if len(caPools.m) >= maxCachedCAs {
		clear(caPools.m)
	}
	caPools.m[pemData] = pool
	return pool, nil
}

// certificateReason names a server certificate that failed verification, for the HTTPS and
// PostgreSQL probers alike.
func certificateReason(err error) (string, bool) {
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		invalid          x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &unknownAuthority):
		return "TLS: certificate signed by unknown authority", true
	case errors.As(err, &hostname):
		return "TLS: certificate is not valid for " + hostname.Host, true
	case errors.As(err, &invalid):
		return "TLS: " + invalid.Error(), true
	}
	return "", false
}

// tlsReason turns a handshake error into "TLS: ...".
func tlsReason(ctx context.Context, err error, timeout time.Duration) string {
	if reason, ok := limitReason(err); ok {
		return reason
	}
	if reason, ok := certificateReason(err); ok {
		return reason
	}
	var recordHeader tls.RecordHeaderError
	switch {
	case errors.As(err, &recordHeader) && strings.HasPrefix(recordHeader.Msg, "oversized record"):
		// crypto/tls's own bound on a record: 16 KiB of payload plus 2 KiB (256 bytes in TLS 1.3).
		return "TLS: " + recordHeader.Msg + " (over crypto/tls's record limit)"
	case errors.As(err, &recordHeader):
		return "TLS: server did not answer with TLS"
	case isTimeout(err), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "TLS handshake: " + netReason(ctx, err, timeout)
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return "TLS handshake: " + netReason(ctx, err, timeout)
	}
	return "TLS: " + strings.TrimPrefix(err.Error(), "tls: ")
}
