// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deckhouse/service-with-healthchecks/testkit/smtpserver"
)

// Protocol is what a test server speaks and what the traffic client expects.
type Protocol string

// The protocols of the test servers. Every reply names the pod ("namespace/name").
const (
	// HTTP answers every request with the configured status (200 unless SetHTTPStatus), the
	// header X-Pod and the body "namespace/name\n".
	HTTP Protocol = "http"
	// TCP writes "namespace/name\n" on accept, then echoes what it reads until the peer closes.
	TCP Protocol = "tcp"
	// SMTP greets with "220 namespace/name ESMTP testkit" and answers HELO/EHLO, NOOP, RSET
	// (250) and QUIT (221); anything else gets 502.
	SMTP Protocol = "smtp"
)

// Server is a real server listening on a port of a pod, inside the pod's network namespace.
type Server struct {
	// Pod is where the server listens.
	Pod *Pod
	// Protocol it speaks.
	Protocol Protocol
	// Port it listens on (all of the pod's addresses).
	Port int

	status atomic.Int32
	delay  atomic.Int64
	hits   atomic.Int64
	wedged atomic.Bool

	mu      sync.Mutex
	ln      net.Listener
	httpSrv *http.Server

	connMu sync.Mutex
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// ServeHTTP starts an HTTP server on the port of the pod; it stops with the pod or the test.
func (p *Pod) ServeHTTP(t testing.TB, port int) *Server {
	t.Helper()
	return p.serve(t, HTTP, port)
}

// ServeTCP starts a TCP server that names the pod and echoes; it stops with the pod or the test.
func (p *Pod) ServeTCP(t testing.TB, port int) *Server {
	t.Helper()
	return p.serve(t, TCP, port)
}

// ServeSMTP starts an SMTP-speaking TCP server; it stops with the pod or the test.
func (p *Pod) ServeSMTP(t testing.TB, port int) *Server {
	t.Helper()
	return p.serve(t, SMTP, port)
}

func (p *Pod) serve(t testing.TB, proto Protocol, port int) *Server {
	t.Helper()
	s := &Server{Pod: p, Protocol: proto, Port: port, conns: map[net.Conn]struct{}{}}
	s.status.Store(http.StatusOK)
	if err := s.Start(); err != nil {
		t.Fatalf("starting %s server on %s port %d: %v", proto, p.Key(), port, err)
	}
	p.mu.Lock()
	p.servers[s] = struct{}{}
	p.mu.Unlock()
	t.Cleanup(s.Stop)
	return s
}

// Addr is the server's address, pod IP and port.
func (s *Server) Addr() string {
	return net.JoinHostPort(s.Pod.IP.String(), strconv.Itoa(s.Port))
}

// SetHTTPStatus sets the status code of the HTTP server's replies (200 at start).
func (s *Server) SetHTTPStatus(code int) { s.status.Store(int32(code)) }

// SetDelay delays every HTTP reply and every greeting (TCP, SMTP) by d, to exercise timeouts.
func (s *Server) SetDelay(d time.Duration) { s.delay.Store(int64(d)) }

// SetWedged makes the TCP or SMTP server a wedged daemon: it still accepts connections but never
// greets or answers; they stay open and silent until the client or Stop closes them. A TCP
// connect still succeeds; a banner check (tcp.steps) fails. Unwedging serves new connections.
func (s *Server) SetWedged(wedged bool) { s.wedged.Store(wedged) }

// Hits counts the requests (HTTP) or connections (TCP, SMTP) the server has accepted.
func (s *Server) Hits() int64 { return s.hits.Load() }

// Running reports whether the server listens.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ln != nil
}

// Start listens again after Stop (no-op while running). Connections are refused while stopped.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return nil
	}
	if s.Pod.Netns == "" {
		return fmt.Errorf("pod %s has no network namespace (ObjectOnly)", s.Pod.Key())
	}
	if s.Pod.gone.Load() {
		return fmt.Errorf("pod %s is deleted", s.Pod.Key())
	}
	var ln net.Listener
	err := inNetns(s.Pod.NetnsPath(), func() error {
		var err error
		ln, err = net.Listen(s.Pod.listenNetwork(), ":"+strconv.Itoa(s.Port))
		return err
	})
	if err != nil {
		return fmt.Errorf("listening on %s: %w", s.Addr(), err)
	}
	s.ln = ln
	if s.Protocol == HTTP {
		s.httpSrv = &http.Server{Handler: http.HandlerFunc(s.serveHTTP), ReadHeaderTimeout: 10 * time.Second}
		srv := s.httpSrv
		s.wg.Go(func() { _ = srv.Serve(ln) })
		return nil
	}
	s.wg.Go(func() { s.acceptLoop(ln) })
	return nil
}

// Stop closes the listener and every open connection and waits for the server's goroutines.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return
	}
	if s.httpSrv != nil {
		_ = s.httpSrv.Close()
		s.httpSrv = nil
	} else {
		_ = s.ln.Close()
	}
	s.ln = nil
	s.connMu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.connMu.Unlock()
	s.wg.Wait()
}

func (s *Server) serveHTTP(w http.ResponseWriter, _ *http.Request) {
	s.hits.Add(1)
	if d := time.Duration(s.delay.Load()); d > 0 {
		time.Sleep(d)
	}
	w.Header().Set("X-Pod", s.Pod.Key())
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(int(s.status.Load()))
	_, _ = fmt.Fprintf(w, "%s\n", s.Pod.Key())
}

func (s *Server) acceptLoop(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		s.hits.Add(1)
		s.connMu.Lock()
		s.conns[c] = struct{}{}
		s.connMu.Unlock()
		s.wg.Go(func() {
			defer func() {
				_ = c.Close()
				s.connMu.Lock()
				delete(s.conns, c)
				s.connMu.Unlock()
			}()
			if d := time.Duration(s.delay.Load()); d > 0 {
				time.Sleep(d)
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Minute))
			if s.wedged.Load() {
				_, _ = io.Copy(io.Discard, c)
				return
			}
			if s.Protocol == SMTP {
				smtpserver.Serve(c, s.Pod.Key())
				return
			}
			s.serveTCP(c)
		})
	}
}

func (s *Server) serveTCP(c net.Conn) {
	if _, err := fmt.Fprintf(c, "%s\n", s.Pod.Key()); err != nil {
		return
	}
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
