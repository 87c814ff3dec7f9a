// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

func TestGRPCVerdictPassesOnlyServing(t *testing.T) {
	cases := map[string]struct {
		st      healthpb.HealthCheckResponse_ServingStatus
		service string
		want    Result
	}{
		"SERVING passes":                          {st: healthpb.HealthCheckResponse_SERVING, want: success("gRPC SERVING")},
		"SERVING of a named service passes":       {st: healthpb.HealthCheckResponse_SERVING, service: "orders", want: success("gRPC SERVING")},
		"NOT_SERVING fails":                       {st: healthpb.HealthCheckResponse_NOT_SERVING, want: failure("gRPC NOT_SERVING")},
		"NOT_SERVING of a named service names it": {st: healthpb.HealthCheckResponse_NOT_SERVING, service: "orders", want: failure(`gRPC NOT_SERVING (service "orders")`)},
		"UNKNOWN fails":                           {st: healthpb.HealthCheckResponse_UNKNOWN, want: failure("gRPC UNKNOWN")},
		"SERVICE_UNKNOWN fails and says what it means": {st: healthpb.HealthCheckResponse_SERVICE_UNKNOWN, service: "orders",
			want: failure(`gRPC SERVICE_UNKNOWN (service "orders"): the health service does not know this service name`)},
		"a status this prober does not know fails": {st: healthpb.HealthCheckResponse_ServingStatus(9), want: failure("gRPC 9")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, grpcVerdict(tc.st, tc.service))
		})
	}
}

func TestGRPCErrorReasonNamesTheCause(t *testing.T) {
	live := context.Background()
	expired, cancel := context.WithDeadline(live, time.Unix(1, 0))
	defer cancel()
	cases := map[string]struct {
		ctx     context.Context
		err     error
		below   error
		service string
		want    string
	}{
		"Unimplemented: the server has no health service": {ctx: live, err: status.Error(codes.Unimplemented, "unknown service grpc.health.v1.Health"),
			want: `gRPC Unimplemented: the server has no health service (grpc.health.v1.Health): unknown service grpc.health.v1.Health`},
		"NotFound: the health service does not know the service": {ctx: live, err: status.Error(codes.NotFound, "unknown service"), service: "orders",
			want: `gRPC NotFound: the health service does not know service "orders": unknown service`},
		"ResourceExhausted names the message bound": {ctx: live, err: status.Error(codes.ResourceExhausted, "grpc: received message larger than max (8388608 vs. 4096)"),
			want: `gRPC ResourceExhausted: the answer exceeds 4 KiB (the prober's limit) or the server is out of resources: grpc: received message larger than max (8388608 vs. 4096)`},
		"another code is named with the server's message, cleaned": {ctx: live, err: status.Error(codes.PermissionDenied, "no\nway"),
			want: "gRPC PermissionDenied: no way"},
		"a code without a message":      {ctx: live, err: status.Error(codes.Internal, ""), want: "gRPC Internal"},
		"a connection error below gRPC": {ctx: live, err: status.Error(codes.Unavailable, "connection error"), below: syscall.ECONNRESET, want: "connection reset by peer"},
		"Unavailable with nothing below is gRPC's": {ctx: live, err: status.Error(codes.Unavailable, "connection closed"),
			want: "gRPC Unavailable: connection closed"},
		"the deadline on a connection that is silent": {ctx: expired, err: status.Error(codes.DeadlineExceeded, "x"), want: "no gRPC answer: timeout after 1s"},
		"the deadline in the TLS handshake":           {ctx: expired, err: status.Error(codes.DeadlineExceeded, "x"), below: &grpcHandshakeError{err: context.DeadlineExceeded}, want: "TLS handshake: timeout after 1s"},
		"a read bound wins over everything":           {ctx: expired, err: status.Error(codes.DeadlineExceeded, "x"), below: errProbeReadLimit, want: errProbeReadLimit.reason},
		"a TLS handshake error is named as TLS's":     {ctx: live, err: status.Error(codes.Unavailable, "x"), below: &grpcHandshakeError{err: errors.New("tls: handshake failure")}, want: "TLS: handshake failure"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, grpcErrorReason(tc.ctx, tc.err, tc.below, tc.service, time.Second))
		})
	}
}

func TestBuildGRPCProbeSharesTheHTTPSBuilder(t *testing.T) {
	pod := netip.MustParseAddrPort("10.0.0.7:9090")
	cfg, err := buildGRPCProbe(&v1alpha1.GRPCProbe{}, pod)
	require.NoError(t, err)
	assert.Nil(t, cfg, "plaintext without tls")

	cfg, err = buildGRPCProbe(&v1alpha1.GRPCProbe{TLS: true}, pod)
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.7", cfg.ServerName, "the pod's IP without a host")
	assert.False(t, cfg.InsecureSkipVerify)

	cfg, err = buildGRPCProbe(&v1alpha1.GRPCProbe{TLS: true, Host: "grpc.example.org:443", InsecureSkipTLSVerify: true}, pod)
	require.NoError(t, err)
	assert.Empty(t, cfg.ServerName, "gRPC takes it from the :authority, host, without its port")
	assert.True(t, cfg.InsecureSkipVerify)

	_, err = buildGRPCProbe(&v1alpha1.GRPCProbe{TLS: true, CACert: "not a PEM"}, pod)
	require.EqualError(t, err, "grpc.caCert: no PEM certificate found")
	_, err = buildGRPCProbe(&v1alpha1.GRPCProbe{CACert: "x"}, pod)
	require.Error(t, err, "a caCert without tls is invalid input")
	assert.True(t, strings.HasPrefix(err.Error(), "grpc."))
}
