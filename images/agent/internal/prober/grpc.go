// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// The bounds of a gRPC probe. Every byte read from the pod, the TLS handshake and HTTP/2
// frames included, counts towards maxProbeReadBytes (the dialer hands gRPC a limitedConn).
const (
	// maxGRPCMessageBytes bounds the health answer: a HealthCheckResponse is two bytes, and a
	// larger message is refused after its 5-byte header, before it is read.
	maxGRPCMessageBytes = 4 << 10
	// maxGRPCHeaderListBytes bounds the response's header and trailer lists (grpc-go allows
	// 16 MiB by default).
	maxGRPCHeaderListBytes = 16 << 10
	// grpcBufferBytes is the size of the transport's read and write buffers (32 KiB by default):
	// a probe sends and reads a few hundred bytes.
	grpcBufferBytes = 4 << 10
	// grpcWindowBytes is HTTP/2's smallest flow-control window. A static window also turns off
	// grpc-go's bandwidth estimation, which sends PINGs.
	grpcWindowBytes = 64 << 10
)

// probeGRPC asks the pod's gRPC health service (grpc.health.v1.Health/Check, unary) about
// g.Service on a fresh connection to addr, closed after the run. ctx carries the probe's
// deadline, which bounds the connect, the handshake and the call together. The probe connects
// itself, on the caller's goroutine, and hands gRPC that one connection: gRPC never dials, so
// never resolves, retries or reconnects, and a refused connect is named as the TCP probe names it.
func (p *Prober) probeGRPC(ctx context.Context, g *v1alpha1.GRPCProbe, addr netip.AddrPort, timeout time.Duration) (Result, error) {
	tlsCfg, err := buildGRPCProbe(g, addr)
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
	trace := &grpcTrace{conn: &tracedConn{limitedConn: newLimitedConn(tcp)}}
	trace.conn.trace = trace
	conn, err := grpc.NewClient("passthrough:///"+addr.String(), grpcDialOptions(g.Host, tlsCfg, trace)...)
	if err != nil {
		return Result{}, fmt.Errorf("grpc client: %w", err)
	}
	defer func() { _ = conn.Close() }()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: g.Service})
	if err != nil {
		return failure(grpcErrorReason(ctx, err, trace.below(), g.Service, timeout)), nil
	}
	return grpcVerdict(resp.GetStatus(), g.Service), nil
}

// buildGRPCProbe validates a gRPC probe and builds its TLS setup (nil without tls), with the
// HTTPS probe's builder: the same fields mean the same. An error is invalid input.
func buildGRPCProbe(g *v1alpha1.GRPCProbe, addr netip.AddrPort) (*tls.Config, error) {
	if !g.TLS {
		if g.CACert != "" || g.InsecureSkipTLSVerify {
			return nil, fmt.Errorf("grpc.caCert and grpc.insecureSkipTLSVerify need tls: true")
		}
		return nil, nil
	}
	cfg, err := tlsConfig(g.Host, addr.Addr(), g.CACert, g.InsecureSkipTLSVerify)
	if err != nil {
		return nil, fmt.Errorf("grpc.%w", err)
	}
	if g.Host != "" {
		// gRPC refuses a server name that differs from the :authority (host); left empty, it
		// takes host without its port, which is what tlsConfig would set.
		cfg.ServerName = ""
	}
	return cfg, nil
}

// grpcDialOptions make gRPC use the probe's connection (trace.take) instead of dialing, with no
// proxy, service config, retry, keep-alive or bandwidth PINGs, small buffers and windows, and the
// message and header bounds above.
func grpcDialOptions(host string, tlsCfg *tls.Config, trace *grpcTrace) []grpc.DialOption {
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = &tracedTLS{TransportCredentials: credentials.NewTLS(tlsCfg), trace: trace}
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return trace.take() }),
		grpc.WithNoProxy(),
		grpc.WithDisableServiceConfig(),
		grpc.WithDisableRetry(),
		grpc.WithDisableHealthCheck(),
		grpc.WithUserAgent("swh-probe"),
		grpc.WithReadBufferSize(grpcBufferBytes),
		grpc.WithWriteBufferSize(grpcBufferBytes),
		grpc.WithStaticStreamWindowSize(grpcWindowBytes),
		grpc.WithStaticConnWindowSize(grpcWindowBytes),
		grpc.WithMaxHeaderListSize(maxGRPCHeaderListBytes),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxGRPCMessageBytes), grpc.MaxCallSendMsgSize(maxGRPCMessageBytes)),
	}
	if host != "" {
		opts = append(opts, grpc.WithAuthority(host))
	}
	return opts
}

// grpcVerdict is the verdict on a health answer: SERVING passes, every other status fails.
func grpcVerdict(st healthpb.HealthCheckResponse_ServingStatus, service string) Result {
	reason := "gRPC " + st.String()
	if st == healthpb.HealthCheckResponse_SERVING {
		return success(reason)
	}
	if service != "" {
		reason += " (service " + strconv.Quote(service) + ")"
	}
	if st == healthpb.HealthCheckResponse_SERVICE_UNKNOWN {
		reason += ": the health service does not know this service name"
	}
	return failure(reason)
}

// grpcErrorReason says why the health call failed: below is the first error gRPC met on the
// connection (the TLS handshake's, a read bound), which gRPC passes on as text only.
func grpcErrorReason(ctx context.Context, err, below error, service string, timeout time.Duration) string {
	if reason, ok := limitReason(below); ok {
		return reason
	}
	st := status.Convert(err)
	if pastDeadline(ctx) || st.Code() == codes.DeadlineExceeded || st.Code() == codes.Canceled {
		if below != nil {
			return belowReason(ctx, below, timeout)
		}
		return "no gRPC answer: " + netReason(ctx, context.DeadlineExceeded, timeout)
	}
	if below != nil && st.Code() == codes.Unavailable {
		return belowReason(ctx, below, timeout)
	}
	return grpcStatusReason(st.Code(), st.Message(), service)
}

// pastDeadline tells whether the probe's deadline has come: the connection carries the same
// deadline (deadlineFromContext), and its read can fail with "i/o timeout" an instant before the
// context's own timer marks the context done; either way the probe ran out of time.
func pastDeadline(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	deadline, ok := ctx.Deadline()
	return ok && !time.Now().Before(deadline)
}

// belowReason names an error below gRPC: a TLS handshake's, or a connection's.
func belowReason(ctx context.Context, err error, timeout time.Duration) string {
	if he, ok := errors.AsType[*grpcHandshakeError](err); ok {
		return tlsReason(ctx, he.err, timeout)
	}
	return netReason(ctx, err, timeout)
}

// grpcStatusReason names a status the call ended with, quoting the server's message.
func grpcStatusReason(code codes.Code, msg, service string) string {
	text := ""
	if msg != "" {
		text = ": " + serverText(msg, maxServerTextBytes)
	}
	switch code {
	case codes.Unimplemented:
		return "gRPC Unimplemented: the server has no health service (grpc.health.v1.Health)" + text
	case codes.NotFound:
		// grpc-go's health server answers so for a service name it was never told about.
		return "gRPC NotFound: the health service does not know service " + strconv.Quote(service) + text
	case codes.ResourceExhausted:
		return "gRPC ResourceExhausted: the answer exceeds " + byteSize(maxGRPCMessageBytes) + " (the prober's limit) or the server is out of resources" + text
	}
	return "gRPC " + code.String() + text
}

// grpcTrace hands gRPC the probe's connection once and records the first error below gRPC.
// gRPC's own goroutines take the connection and read from it, so it takes a lock.
type grpcTrace struct {
	mu   sync.Mutex
	conn *tracedConn // nil once taken
	err  error
}

// take gives the connection to the first caller; gRPC reconnecting gets an error.
func (t *grpcTrace) take() (net.Conn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.conn
	if c == nil {
		return nil, errConnectionUsed
	}
	t.conn = nil
	return c, nil
}

func (t *grpcTrace) record(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err == nil {
		t.err = err
	}
}

// below is the first error recorded, nil if none.
func (t *grpcTrace) below() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// errConnectionUsed ends gRPC's attempt to reconnect: a probe has one connection.
var errConnectionUsed = errors.New("the probe's one connection is already used")

// tracedConn records the read bound when gRPC's reader hits it.
type tracedConn struct {
	*limitedConn
	trace *grpcTrace
}

func (c *tracedConn) Read(p []byte) (int, error) {
	n, err := c.limitedConn.Read(p)
	if _, ok := limitReason(err); ok {
		c.trace.record(err)
	}
	return n, err
}

// grpcHandshakeError marks a recorded error as the TLS handshake's.
type grpcHandshakeError struct{ err error }

func (e *grpcHandshakeError) Error() string { return e.err.Error() }
func (e *grpcHandshakeError) Unwrap() error { return e.err }

// tracedTLS is gRPC's TLS with the handshake bounded by maxTLSHandshakeBytes, as for HTTPS,
// and its error recorded.
type tracedTLS struct {
	credentials.TransportCredentials
	trace *grpcTrace
}

func (t *tracedTLS) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if tc, ok := raw.(*tracedConn); ok {
		tc.bound(maxTLSHandshakeBytes, errTLSHandshakeLimit)
		defer tc.unbound()
	}
	conn, info, err := t.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		t.trace.record(&grpcHandshakeError{err: err})
	}
	return conn, info, err
}

func (t *tracedTLS) Clone() credentials.TransportCredentials {
	return &tracedTLS{TransportCredentials: t.TransportCredentials.Clone(), trace: t.trace}
}
