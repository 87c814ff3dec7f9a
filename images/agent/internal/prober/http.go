// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// probeHTTP sends one request on a fresh connection to the pod's IP and judges the status code.
// It does not use http.Client: no connection pool to keep, no redirect to follow, and the Host
// header and TLS server name come from the probe while the dial target is always addr. The
// steps: build (pure, httprequest.go and tls.go), dial, bound the connection (and shake hands),
// exchange one request and response.
func (p *Prober) probeHTTP(ctx context.Context, h *v1alpha1.HTTPProbe, addr netip.AddrPort, timeout time.Duration) (Result, error) {
	req, tlsCfg, err := buildHTTPProbe(h, addr)
	if err != nil {
		return Result{}, err
	}
	tcp, err := dial(ctx, addr)
	if err != nil {
		return failure(netReason(ctx, err, timeout)), nil
	}
	defer func() { _ = tcp.Close() }()
	stop := deadlineFromContext(ctx, tcp)
	defer stop()
	rw, reason := startHTTP(ctx, tcp, tlsCfg, timeout)
	if rw == nil {
		return failure(reason), nil
	}
	return exchangeHTTP(ctx, rw, req, h.SuccessStatusCodes, timeout), nil
}

// buildHTTPProbe validates an HTTP probe and builds what it sends: the request and, for HTTPS,
// the TLS setup (nil for HTTP). An error is invalid input, never the pod's fault.
func buildHTTPProbe(h *v1alpha1.HTTPProbe, addr netip.AddrPort) (*http.Request, *tls.Config, error) {
	if err := validateStatusCodes(h.SuccessStatusCodes); err != nil {
		return nil, nil, err
	}
	req, err := newHTTPRequest(h.Method, h.Path, h.Host, h.HTTPHeaders, addr)
	if err != nil {
		return nil, nil, err
	}
	https, err := isHTTPS(string(h.Scheme))
	if err != nil {
		return nil, nil, err
	}
	if !https {
		return req, nil, nil
	}
	tlsCfg, err := tlsConfig(h.Host, addr.Addr(), h.CACert, h.InsecureSkipTLSVerify)
	if err != nil {
		return nil, nil, fmt.Errorf("http.%w", err)
	}
	return req, tlsCfg, nil
}

// deadlineFromContext makes reads and writes on c end at ctx's deadline, and at once when ctx
// is cancelled (not only at its deadline). Call stop when done with c. (c is the concrete
// type: the closure then holds a pointer, not an interface, and stays in a smaller size class.)
func deadlineFromContext(ctx context.Context, c *net.TCPConn) (stop func() bool) {
	if deadline, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(deadline)
	}
	return context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
}

// startHTTP puts every byte read from tcp through a limitedConn, which bounds the whole probe
// and, during the handshake, the handshake; with tlsCfg it shakes hands. It returns the
// connection to speak HTTP on, or nil and the reason of the failure.
func startHTTP(ctx context.Context, tcp net.Conn, tlsCfg *tls.Config, timeout time.Duration) (net.Conn, string) {
	conn := newLimitedConn(tcp)
	if tlsCfg == nil {
		return conn, ""
	}
	tc := tls.Client(conn, tlsCfg)
	conn.bound(maxTLSHandshakeBytes, errTLSHandshakeLimit)
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, tlsReason(ctx, err, timeout)
	}
	conn.unbound()
	return tc, ""
}

// exchangeHTTP writes req on rw and judges the response by its status code (codes is the
// probe's successStatusCodes, validated before).
func exchangeHTTP(ctx context.Context, rw net.Conn, req *http.Request, codes []string, timeout time.Duration) Result {
	if err := writeRequest(req, rw); err != nil {
		return failure("sending request: " + netReason(ctx, err, timeout))
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
		return failure(responseReason(ctx, err, head.failed, timeout))
	}
	// Read a bounded part of the body so a small response is consumed; a large or slow body
	// does not change the verdict, which is the status code. What the bufio.Reader holds was
	// counted as headers, so at most maxBodyBytes more are read from the connection.
	head.n, head.err = maxBodyBytes, io.EOF
	_, _ = io.CopyN(io.Discard, resp.Body, maxBodyBytes)
	return statusVerdict(resp.StatusCode, codes)
}

// responseReason says why no response could be read: err is http.ReadResponse's, failed the
// first error of the read under it (nil if none).
func responseReason(ctx context.Context, err, failed error, timeout time.Duration) string {
	if failed != nil {
		// The read error that cut the response short is the reason, not the partial line
		// it left behind ("malformed MIME header").
		err = failed
	}
	if reason, ok := limitReason(err); ok {
		return reason
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "connection closed before a response"
	}
	return "reading response: " + netReason(ctx, err, timeout)
}

// statusVerdict is the verdict on a status code: "HTTP 200", passed or failed by statusPasses.
func statusVerdict(code int, codes []string) Result {
	reason := "HTTP " + strconv.Itoa(code)
	if statusPasses(code, codes) {
		return success(reason)
	}
	return failure(reason)
}

// The buffers of HTTP probes, reused from probe to probe: allocated for each one, the reader's
// and the writer's 4 KiB were more than half of an HTTP probe's garbage, which at thousands of
// probes a second sets the pace of the agent's garbage collector
// (development/BENCHMARKS-HISTORY.md, "HTTP probe buffers"). A buffer returns to its pool reset: nothing of one pod's answer can
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
