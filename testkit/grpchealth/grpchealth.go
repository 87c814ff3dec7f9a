// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package grpchealth runs real grpc-go servers for tests of gRPC health probes: the standard
// health service (google.golang.org/grpc/health) whose statuses a test flips, a server without
// it, one that answers with a huge message, and the table of cases every gRPC health prober
// must judge alike (Cases), which the agent's prober and the kubelet's (bench/probes) both run.
package grpchealth

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The statuses a health server answers with.
const (
	Serving    = healthpb.HealthCheckResponse_SERVING
	NotServing = healthpb.HealthCheckResponse_NOT_SERVING
	Unknown    = healthpb.HealthCheckResponse_UNKNOWN
)

// Server is a grpc-go server listening on a listener the caller made (on loopback, or in a
// pod's network namespace), with the standard health service unless started WithoutHealth.
type Server struct {
	srv    *grpc.Server
	health *health.Server
	ln     net.Listener
	done   chan struct{}
}

// Options of a Server.
type Options struct {
	// TLS serves gRPC over TLS with this setup.
	TLS *tls.Config
	// WithoutHealth registers no health service: Check gets Unimplemented.
	WithoutHealth bool
	// HugeAnswer answers every call of every method (the health service is then not registered)
	// with a message of this many bytes.
	HugeAnswer int
}

// Serve serves gRPC on ln until Stop. The whole server ("") starts SERVING.
func Serve(ln net.Listener, opts Options) *Server {
	var sopts []grpc.ServerOption
	if opts.TLS != nil {
		sopts = append(sopts, grpc.Creds(credentials.NewTLS(opts.TLS)))
	}
	if opts.HugeAnswer > 0 {
		sopts = append(sopts, grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(hugeAnswer(opts.HugeAnswer)))
	}
	s := &Server{srv: grpc.NewServer(sopts...), ln: ln, done: make(chan struct{})}
	if !opts.WithoutHealth && opts.HugeAnswer == 0 {
		s.health = health.NewServer()
		healthpb.RegisterHealthServer(s.srv, s.health)
	}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s
}

// Start is Serve on a new loopback listener; it stops with the test.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listening: %v", err)
	}
	s := Serve(ln, opts)
	t.Cleanup(s.Stop)
	return s
}

// Port is the port the server listens on.
func (s *Server) Port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// Set makes the health service answer st for service ("" is the whole server).
func (s *Server) Set(service string, st healthpb.HealthCheckResponse_ServingStatus) {
	s.health.SetServingStatus(service, st)
}

// Stop closes the listener and every connection at once and waits for the server to end.
func (s *Server) Stop() {
	s.srv.Stop()
	<-s.done
}

// hugeAnswer answers any call with n bytes, whatever was asked.
func hugeAnswer(n int) grpc.StreamHandler {
	return func(_ any, stream grpc.ServerStream) error {
		var req []byte
		if err := stream.RecvMsg(&req); err != nil {
			return err
		}
		return stream.SendMsg(make([]byte, n))
	}
}

// rawCodec passes messages as bytes, so a handler can answer with any message.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

// Case is a server and the verdict a gRPC health prober must reach on it. Probes use
// Timeout.
type Case struct {
	// Start starts the server and returns its loopback port.
	Start func(t testing.TB) int
	// Service is the name the probe asks about.
	Service string
	// TLS: the probe speaks TLS and accepts any certificate (the kubelet's only TLS mode).
	TLS bool
	// Pass is the verdict.
	Pass bool
}

// Timeout is the deadline of the probes of Cases.
const Timeout = time.Second

// Cases are the servers on which the agent's gRPC probe and the kubelet's must agree.
func Cases(tlsConfig func(t testing.TB) *tls.Config) map[string]Case {
	with := func(opts Options, set func(*Server)) func(t testing.TB) int {
		return func(t testing.TB) int {
			s := Start(t, opts)
			if set != nil {
				set(s)
			}
			return s.Port()
		}
	}
	return map[string]Case{
		"a server that is SERVING passes":        {Start: with(Options{}, nil), Pass: true},
		"a server that is NOT_SERVING fails":     {Start: with(Options{}, func(s *Server) { s.Set("", NotServing) })},
		"a server whose status is UNKNOWN fails": {Start: with(Options{}, func(s *Server) { s.Set("", Unknown) })},
		"a named service that is SERVING passes": {Start: with(Options{}, func(s *Server) { s.Set("orders", Serving) }), Service: "orders", Pass: true},
		"a named service that is NOT_SERVING fails while the server serves": {
			Start: with(Options{}, func(s *Server) { s.Set("orders", NotServing) }), Service: "orders",
		},
		"a service the health service does not know fails": {Start: with(Options{}, nil), Service: "orders"},
		"a server without the health service fails":        {Start: with(Options{WithoutHealth: true}, nil)},
		"a health answer of 8 MiB fails":                   {Start: with(Options{HugeAnswer: 8 << 20}, nil)},
		"a server that accepts and never answers fails":    {Start: silent},
		"a closed port fails":                              {Start: closedPort},
		"a SERVING server over TLS passes":                 {Start: func(t testing.TB) int { return with(Options{TLS: tlsConfig(t)}, nil)(t) }, TLS: true, Pass: true},
		"a NOT_SERVING server over TLS fails": {Start: func(t testing.TB) int {
			return with(Options{TLS: tlsConfig(t)}, func(s *Server) { s.Set("", NotServing) })(t)
		}, TLS: true},
		"a plaintext probe of a server that speaks TLS fails": {Start: func(t testing.TB) int { return with(Options{TLS: tlsConfig(t)}, nil)(t) }},
	}
}

// silent accepts connections and never writes; they close with the test.
func silent(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listening: %v", err)
	}
	conns := make(chan net.Conn, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case conns <- c:
			default:
				_ = c.Close()
			}
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		close(conns)
		for c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().(*net.TCPAddr).Port
}

// closedPort is a loopback port nothing listens on.
func closedPort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listening: %v", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	return port
}
