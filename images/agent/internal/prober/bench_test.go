// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/prober"
	"github.com/deckhouse/service-with-healthchecks/testkit/grpchealth"
)

// The servers below match bench/probes (the kubelet's probers), so bench/probes/run.sh compares
// both in one run. Results are in development/BENCHMARKS.md.

func benchTCPTarget(b *testing.B) int32 {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	return port(l)
}

func benchHTTPTarget(b *testing.B) int32 {
	b.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	b.Cleanup(srv.Close)
	return int32(srv.Listener.Addr().(*net.TCPAddr).Port)
}

func benchProbe(b *testing.B, probe v1alpha1.Probe, p *prober.Prober, host string, port int32) {
	b.Helper()
	b.ReportAllocs()
	for b.Loop() {
		res, err := p.Probe(b.Context(), probe, "ns", host, port)
		if err != nil || res.Outcome != prober.Success {
			b.Fatalf("probe: %+v %v", res, err)
		}
	}
}

func BenchmarkTCP(b *testing.B) {
	benchProbe(b, tcpProbe(1), prober.New(prober.Options{}), "127.0.0.1", benchTCPTarget(b))
}

func BenchmarkHTTP(b *testing.B) {
	benchProbe(b, httpProbe(v1alpha1.HTTPProbe{Path: "/healthz"}), prober.New(prober.Options{}), "127.0.0.1", benchHTTPTarget(b))
}

// BenchmarkPostgreSQL is a full probe: connect, SCRAM, read-only transaction, query, close.
// BenchmarkGRPC probes a grpc-go health server (testkit/grpchealth), as BenchmarkKubeletGRPC in
// bench/probes does with the kubelet's gRPC probe.
func BenchmarkGRPC(b *testing.B) {
	s := grpchealth.Start(b, grpchealth.Options{})
	benchProbe(b, grpcProbe(v1alpha1.GRPCProbe{}), prober.New(prober.Options{}), "127.0.0.1", int32(s.Port()))
}

func BenchmarkPostgreSQL(b *testing.B) {
	pg := pgServers(b)
	secrets := staticCredentials{"app": pgSecret(map[string]string{"user": "app", "password": appPassword})}
	benchProbe(b, pgProbe("SELECT 1", "", "app", 5), prober.New(prober.Options{Credentials: secrets}), pg.primary.Host, int32(pg.primary.Port))
}

// BenchmarkPostgreSQLConnectOnly is the floor of BenchmarkPostgreSQL: a bare pgx connection
// with the same role (SCRAM) that is closed at once, no query.
func BenchmarkPostgreSQLConnectOnly(b *testing.B) {
	pg := pgServers(b)
	cfg, err := pgconn.ParseConfig(fmt.Sprintf("host=%s port=%d user=app dbname=postgres sslmode=disable", pg.primary.Host, pg.primary.Port))
	if err != nil {
		b.Fatal(err)
	}
	cfg.Password = appPassword
	b.ReportAllocs()
	for b.Loop() {
		c, err := pgconn.ConnectConfig(b.Context(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		_ = c.Close(b.Context())
	}
}
