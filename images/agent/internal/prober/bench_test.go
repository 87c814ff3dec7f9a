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

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/prober"
	"github.com/deckhouse/service-with-healthchecks/testkit/grpchealth"
)

// The servers below match bench/probes (the kubelet's probers), so bench/probes/run.sh compares
// both in one run. Results are in development/BENCHMARKS.md.

// benchAcceptor listens on loopback until the benchmark ends and hands every connection to
// handle, on the accepting goroutine; it returns the port.
func benchAcceptor(b *testing.B, handle func(net.Conn)) int32 {
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
			handle(c)
		}
	}()
	return port(l)
}

func benchTCPTarget(b *testing.B) int32 {
	b.Helper()
	return benchAcceptor(b, func(c net.Conn) { _ = c.Close() })
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

// BenchmarkMySQL is a full probe against a real MariaDB: connect, mysql_native_password,
// read-only transaction, query, close.
func BenchmarkMySQL(b *testing.B) {
	my := myServers(b)
	secrets := staticCredentials{"app": mySecret(map[string]string{"user": "app", "password": myAppPassword})}
	benchProbe(b, myProbe("SELECT @@read_only = 0", "", "app", 5), prober.New(prober.Options{Credentials: secrets}), my.primary.Host, int32(my.primary.Port))
}

// BenchmarkMySQLConnectOnly is the floor of BenchmarkMySQL: a bare driver connection with the
// same account that is closed at once, no transaction, no query.
func BenchmarkMySQLConnectOnly(b *testing.B) {
	my := myServers(b)
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.User, cfg.Passwd = "tcp", my.primary.Address(), "app", myAppPassword
	cfg.MaxAllowedPacket = 64 << 10
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		c, err := connector.Connect(b.Context())
		if err != nil {
			b.Fatal(err)
		}
		_ = c.Close()
	}
}

// benchPingTarget answers every "PING\r\n" with "+PONG\r\n", like Redis, until the client goes.
func benchPingTarget(b *testing.B) int32 {
	b.Helper()
	return benchAcceptor(b, func(c net.Conn) {
		go func() {
			defer c.Close()
			buf := make([]byte, 64)
			for {
				if _, err := c.Read(buf); err != nil {
					return
				}
				if _, err := io.WriteString(c, "+PONG\r\n"); err != nil {
					return
				}
			}
		}()
	})
}

// BenchmarkTCPSendExpect is a Redis-style PING/+PONG dialogue: connect, send, read the reply,
// match the prefix, reset. BenchmarkTCP is its floor.
func BenchmarkTCPSendExpect(b *testing.B) {
	probe := v1alpha1.Probe{Mode: v1alpha1.ProbeModeTCP, TimeoutSeconds: 1, TCP: &v1alpha1.TCPProbe{
		Steps: []v1alpha1.TCPStep{{Send: `PING\r\n`}, {Expect: &v1alpha1.TCPExpect{Prefix: `+PONG\r\n`}}}}}
	benchProbe(b, probe, prober.New(prober.Options{}), "127.0.0.1", benchPingTarget(b))
}

// BenchmarkTCPSendExpectRegex is the same dialogue decided by a regular expression (compiled
// once, then taken from the prober's cache).
func BenchmarkTCPSendExpectRegex(b *testing.B) {
	probe := v1alpha1.Probe{Mode: v1alpha1.ProbeModeTCP, TimeoutSeconds: 1, TCP: &v1alpha1.TCPProbe{
		Steps: []v1alpha1.TCPStep{{Send: `PING\r\n`}, {Expect: &v1alpha1.TCPExpect{Regex: `^\+PONG\r\n`}}}}}
	benchProbe(b, probe, prober.New(prober.Options{}), "127.0.0.1", benchPingTarget(b))
}
