// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober_test

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/prober"
	"github.com/deckhouse/service-with-healthchecks/testkit/grpchealth"
	"github.com/deckhouse/service-with-healthchecks/testkit/pki"
)

func grpcProbe(g v1alpha1.GRPCProbe) v1alpha1.Probe {
	g.TargetPort = intstr.FromInt32(1)
	return v1alpha1.Probe{Mode: v1alpha1.ProbeModeGRPC, TimeoutSeconds: 1, GRPC: &g}
}

// selfSignedTLS is a server setup for 127.0.0.1 from a fresh CA (the kubelet's gRPC probe
// accepts any certificate).
func selfSignedTLS(t testing.TB) *tls.Config {
	t.Helper()
	ca, err := pki.NewCA("grpc-ca")
	require.NoError(t, err)
	pair, err := ca.Server("grpc", nil, []net.IP{net.ParseIP("127.0.0.1")})
	require.NoError(t, err)
	cert, err := pair.TLSCertificate()
	require.NoError(t, err)
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}

// The kubelet's gRPC probe (k8s.io/kubernetes/pkg/probe/grpc) runs the same table in
// bench/probes (TestKubeletGRPCAgreesOnTheSharedCases): both must reach its verdicts.
func TestGRPCAgreesWithTheKubeletOnTheSharedCases(t *testing.T) {
	p := newProber(prober.Options{})
	for name, tc := range grpchealth.Cases(selfSignedTLS) {
		t.Run(name, func(t *testing.T) {
			port := tc.Start(t)
			probe := grpcProbe(v1alpha1.GRPCProbe{Service: tc.Service, TLS: tc.TLS, InsecureSkipTLSVerify: tc.TLS})
			probe.TimeoutSeconds = int32(grpchealth.Timeout / time.Second)
			start := time.Now()
			res, err := p.Probe(t.Context(), probe, "ns", "127.0.0.1", int32(port))
			require.NoError(t, err)
			assert.Equal(t, tc.Pass, res.Outcome == prober.Success, "verdict: %s", res.Reason)
			assert.Less(t, time.Since(start), deadlineBound(probe.TimeoutSeconds), "the probe ends by its deadline")
		})
	}
}

func TestGRPCReasons(t *testing.T) {
	p := newProber(prober.Options{})
	server := func(set func(*grpchealth.Server)) func(t testing.TB) int {
		return func(t testing.TB) int {
			s := grpchealth.Start(t, grpchealth.Options{})
			if set != nil {
				set(s)
			}
			return s.Port()
		}
	}
	cases := map[string]struct {
		start   func(t testing.TB) int
		service string
		want    prober.Result
	}{
		"the whole server SERVING": {start: server(nil), want: prober.Result{Outcome: prober.Success, Reason: "gRPC SERVING"}},
		"the whole server NOT_SERVING": {start: server(func(s *grpchealth.Server) { s.Set("", grpchealth.NotServing) }),
			want: prober.Result{Outcome: prober.Failure, Reason: "gRPC NOT_SERVING"}},
		"a named service NOT_SERVING while the server serves": {start: server(func(s *grpchealth.Server) { s.Set("orders", grpchealth.NotServing) }), service: "orders",
			want: prober.Result{Outcome: prober.Failure, Reason: `gRPC NOT_SERVING (service "orders")`}},
		"a named service SERVING while the server does not": {start: server(func(s *grpchealth.Server) {
			s.Set("", grpchealth.NotServing)
			s.Set("orders", grpchealth.Serving)
		}), service: "orders", want: prober.Result{Outcome: prober.Success, Reason: "gRPC SERVING"}},
		"a service the health service does not know": {start: server(nil), service: "orders",
			want: prober.Result{Outcome: prober.Failure, Reason: `gRPC NotFound: the health service does not know service "orders": unknown service`}},
		"a server without the health service": {start: func(t testing.TB) int { return grpchealth.Start(t, grpchealth.Options{WithoutHealth: true}).Port() },
			want: prober.Result{Outcome: prober.Failure, Reason: `gRPC Unimplemented: the server has no health service (grpc.health.v1.Health): unknown service grpc.health.v1.Health`}},
		"a health answer of 8 MiB is refused by its header": {start: func(t testing.TB) int { return grpchealth.Start(t, grpchealth.Options{HugeAnswer: 8 << 20}).Port() },
			want: prober.Result{Outcome: prober.Failure, Reason: `gRPC ResourceExhausted: the answer exceeds 4 KiB (the prober's limit) or the server is out of resources: grpc: received message larger than max (8388608 vs. 4096)`}},
		"a server that accepts and never answers": {start: grpchealth.Cases(selfSignedTLS)["a server that accepts and never answers fails"].Start,
			want: prober.Result{Outcome: prober.Failure, Reason: "no gRPC answer: timeout after 1s"}},
		"a closed port": {start: grpchealth.Cases(selfSignedTLS)["a closed port fails"].Start,
			want: prober.Result{Outcome: prober.Failure, Reason: "connection refused"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			res, err := p.Probe(t.Context(), grpcProbe(v1alpha1.GRPCProbe{Service: tc.service}), "ns", "127.0.0.1", int32(tc.start(t)))
			require.NoError(t, err)
			assert.Equal(t, tc.want, res)
		})
	}
}

func TestGRPCOverTLS(t *testing.T) {
	ca, err := pki.NewCA("grpc-probe-ca")
	require.NoError(t, err)
	otherCA, err := pki.NewCA("other-ca")
	require.NoError(t, err)
	byName, err := ca.Server("app", []string{"grpc.example.org"}, nil)
	require.NoError(t, err)
	byIP, err := ca.Server("pod", nil, []net.IP{net.ParseIP("127.0.0.1")})
	require.NoError(t, err)

	type seen struct{ sni, authority string }
	start := func(t *testing.T, pair pki.Pair) (int32, func() seen) {
		cert, err := pair.TLSCertificate()
		require.NoError(t, err)
		var mu sync.Mutex
		var last seen
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			mu.Lock()
			last.sni = h.ServerName
			mu.Unlock()
			return &cert, nil
		}}
		record := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			mu.Lock()
			if a := md.Get(":authority"); len(a) > 0 {
				last.authority = a[0]
			}
			mu.Unlock()
			return handler(ctx, req)
		}
		srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)), grpc.UnaryInterceptor(record))
		healthpb.RegisterHealthServer(srv, health.NewServer())
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = srv.Serve(ln)
		}()
		t.Cleanup(func() {
			srv.Stop()
			<-done
		})
		return port(ln), func() seen {
			mu.Lock()
			defer mu.Unlock()
			return last
		}
	}
	p := newProber(prober.Options{})
	cases := map[string]struct {
		pair  pki.Pair
		probe v1alpha1.GRPCProbe
		want  prober.Result
		seen  *seen
	}{
		"a certificate signed by caCert for host passes, with SNI and :authority from host": {pair: byName,
			probe: v1alpha1.GRPCProbe{TLS: true, Host: "grpc.example.org", CACert: string(ca.CertPEM)},
			want:  prober.Result{Outcome: prober.Success, Reason: "gRPC SERVING"},
			seen:  &seen{sni: "grpc.example.org", authority: "grpc.example.org"}},
		"a host with a port sends SNI without it": {pair: byName,
			probe: v1alpha1.GRPCProbe{TLS: true, Host: "grpc.example.org:9443", CACert: string(ca.CertPEM)},
			want:  prober.Result{Outcome: prober.Success, Reason: "gRPC SERVING"},
			seen:  &seen{sni: "grpc.example.org", authority: "grpc.example.org:9443"}},
		"without host the certificate must name the pod's IP, and no SNI is sent": {pair: byIP,
			probe: v1alpha1.GRPCProbe{TLS: true, CACert: string(ca.CertPEM)},
			want:  prober.Result{Outcome: prober.Success, Reason: "gRPC SERVING"},
			seen:  &seen{sni: ""}},
		"a certificate from another CA fails": {pair: byName,
			probe: v1alpha1.GRPCProbe{TLS: true, Host: "grpc.example.org", CACert: string(otherCA.CertPEM)},
			want:  prober.Result{Outcome: prober.Failure, Reason: "TLS: certificate signed by unknown authority"}},
		"a certificate for another name fails": {pair: byName,
			probe: v1alpha1.GRPCProbe{TLS: true, Host: "other.example.org", CACert: string(ca.CertPEM)},
			want:  prober.Result{Outcome: prober.Failure, Reason: "TLS: certificate is not valid for other.example.org"}},
		"insecureSkipTLSVerify accepts a certificate from any CA": {pair: byName,
			probe: v1alpha1.GRPCProbe{TLS: true, InsecureSkipTLSVerify: true},
			want:  prober.Result{Outcome: prober.Success, Reason: "gRPC SERVING"}},
		"the system roots do not know a private CA": {pair: byIP,
			probe: v1alpha1.GRPCProbe{TLS: true},
			want:  prober.Result{Outcome: prober.Failure, Reason: "TLS: certificate signed by unknown authority"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			srvPort, seenBy := start(t, tc.pair)
			res, err := p.Probe(t.Context(), grpcProbe(tc.probe), "ns", "127.0.0.1", srvPort)
			require.NoError(t, err)
			assert.Equal(t, tc.want, res)
			if tc.seen != nil {
				got := seenBy()
				assert.Equal(t, tc.seen.sni, got.sni, "SNI")
				if tc.seen.authority != "" {
					assert.Equal(t, tc.seen.authority, got.authority, ":authority")
				}
			}
		})
	}
}

func TestGRPCInvalidInputIsAnError(t *testing.T) {
	p := newProber(prober.Options{})
	_, err := p.Probe(t.Context(), grpcProbe(v1alpha1.GRPCProbe{TLS: true, CACert: "not a PEM"}), "ns", "127.0.0.1", 9090)
	require.EqualError(t, err, "grpc.caCert: no PEM certificate found")
	_, err = p.Probe(t.Context(), v1alpha1.Probe{Mode: v1alpha1.ProbeModeGRPC, TimeoutSeconds: 1}, "ns", "127.0.0.1", 9090)
	require.EqualError(t, err, "mode GRPC without a grpc block")
}
