// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Command swh-testserver is the multi-mode test server of the pods on real test nodes
// (testkit/realnode), packed into the local OCI image swh.test/testserver:1. Every argument
// MODE=ADDR starts one listener speaking MODE on ADDR (":2525"); one process serves as many as
// a pod needs, so a test can put a well-behaved port beside a hostile one in the same container.
// Replies that carry text name the pod ("namespace/name" from POD_NAMESPACE and POD_NAME).
//
//	swh-testserver [-control ADDR] http=:8080 smtp=:2525 endless-headers=:8082 grpc-health=:9090
//
// Modes (the servers of testkit/cluster and of the agent's prober tests, as a process):
//
//	http             HTTP/1.1: every request gets the current status (200 at start), the header
//	                 X-Pod and the body "namespace/name\n"
//	smtp             greets "220 namespace/name ESMTP testkit" and answers HELO/EHLO, NOOP, RSET
//	                 (250) and QUIT (221), anything else 502; wedged (below) it accepts and never
//	                 greets
//	silent           accepts, reads and never writes (a hung daemon: a TCP connect passes)
//	endless-headers  reads the request's head, then sends "HTTP/1.1 200 OK\r\nX-A: " and 'a'
//	                 bytes until the client hangs up (a header line that never ends)
//	huge-body        reads the request's head, answers 200 with Content-Length 1 TiB and sends
//	                 zeros until the client hangs up
//	grpc-health      grpc-go with the standard health service (testkit/grpchealth), the whole
//	                 server ("") SERVING at start
//
// The control listener (-control, plain HTTP; only POST changes anything) flips them at run time:
//
//	POST /http/status/{code}             the http listeners' status from now on
//	POST /smtp/wedge, /smtp/unwedge      new smtp connections are not greeted / greeted again
//	POST /smtp/stop, /smtp/start         close the smtp listeners and their connections
//	                                     (connections refused) / listen again
//	POST /grpc/status/{status}           SERVING, NOT_SERVING or UNKNOWN for ?service= ("")
//	GET  /healthz                        200 while the process runs
//
// SIGTERM or SIGINT: wait -term-delay, then close every listener and exit 0.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/deckhouse/service-with-healthchecks/testkit/grpchealth"
	"github.com/deckhouse/service-with-healthchecks/testkit/smtpserver"
)

// Modes of a listener.
const (
	modeHTTP           = "http"
	modeSMTP           = "smtp"
	modeSilent         = "silent"
	modeEndlessHeaders = "endless-headers"
	modeHugeBody       = "huge-body"
	modeGRPCHealth     = "grpc-health"
)

var modes = []string{modeHTTP, modeSMTP, modeSilent, modeEndlessHeaders, modeHugeBody, modeGRPCHealth}

// hugeBodyLength is the Content-Length huge-body announces (1 TiB).
const hugeBodyLength = 1 << 40

func main() {
	fs := flag.NewFlagSet("swh-testserver", flag.ExitOnError)
	control := fs.String("control", "", "address of the control listener (HTTP); empty: none")
	termDelay := fs.Duration("term-delay", 0, "how long to keep serving after SIGTERM")
	fs.Usage = func() {
		_, _ = fmt.Fprintf(fs.Output(), "usage: swh-testserver [-control ADDR] [-term-delay D] MODE=ADDR...\nmodes: %s\n", strings.Join(modes, ", "))
		fs.PrintDefaults()
	}
	_ = fs.Parse(os.Args[1:])
	srv, err := newServer(os.Getenv("POD_NAMESPACE")+"/"+os.Getenv("POD_NAME"), fs.Args())
	if err != nil {
		fmt.Fprintln(os.Stderr, "swh-testserver: "+err.Error())
		os.Exit(2)
	}
	if err := srv.start(*control); err != nil {
		log.Fatalf("swh-testserver: %v", err)
	}
	log.Printf("%s serving %s (control %q)", srv.pod, strings.Join(fs.Args(), " "), *control)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	log.Printf("terminating in %s", *termDelay)
	time.Sleep(*termDelay)
	srv.stop()
}

// listener is one MODE=ADDR.
type listener struct {
	mode, addr string

	mu   sync.Mutex
	ln   net.Listener
	grpc *grpchealth.Server
	http *http.Server
	wg   sync.WaitGroup

	connMu sync.Mutex
	conns  map[net.Conn]struct{}
}

// server is the process's listeners and their switches.
type server struct {
	pod       string
	listeners []*listener
	status    atomic.Int32
	wedged    atomic.Bool
	control   *http.Server
	controlLn net.Listener
}

func newServer(pod string, args []string) (*server, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("no MODE=ADDR given (modes: %s)", strings.Join(modes, ", "))
	}
	s := &server{pod: pod}
	s.status.Store(http.StatusOK)
	for _, a := range args {
		mode, addr, ok := strings.Cut(a, "=")
		if !ok || addr == "" {
			return nil, fmt.Errorf("argument %q: want MODE=ADDR, e.g. smtp=:2525", a)
		}
		known := false
		for _, m := range modes {
			known = known || m == mode
		}
		if !known {
			return nil, fmt.Errorf("argument %q: unknown mode %q (modes: %s)", a, mode, strings.Join(modes, ", "))
		}
		s.listeners = append(s.listeners, &listener{mode: mode, addr: addr, conns: map[net.Conn]struct{}{}})
	}
	return s, nil
}

// start opens every listener and the control listener (when addr is set).
func (s *server) start(controlAddr string) error {
	for _, l := range s.listeners {
		if err := s.listen(l); err != nil {
			return err
		}
	}
	if controlAddr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", controlAddr)
	if err != nil {
		return fmt.Errorf("control listener: %w", err)
	}
	s.controlLn = ln
	s.control = &http.Server{Handler: s.controlMux(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.control.Serve(ln) }()
	return nil
}

// stop closes every listener, its connections and the control listener.
func (s *server) stop() {
	for _, l := range s.listeners {
		l.close()
	}
	if s.control != nil {
		_ = s.control.Close()
	}
}

// listen opens l (no-op while it is open).
func (s *server) listen(l *listener) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		return fmt.Errorf("%s=%s: %w", l.mode, l.addr, err)
	}
	l.ln = ln
	switch l.mode {
	case modeGRPCHealth:
		l.grpc = grpchealth.Serve(ln, grpchealth.Options{})
	case modeHTTP:
		l.http = &http.Server{Handler: http.HandlerFunc(s.serveHTTP), ReadHeaderTimeout: 10 * time.Second}
		srv := l.http
		l.wg.Go(func() { _ = srv.Serve(ln) })
	default:
		l.wg.Go(func() { s.acceptLoop(l, ln) })
	}
	return nil
}

// close closes l's listener and connections and waits for its goroutines.
func (l *listener) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln == nil {
		return
	}
	switch {
	case l.grpc != nil:
		l.grpc.Stop()
		l.grpc = nil
	case l.http != nil:
		_ = l.http.Close()
		l.http = nil
	default:
		_ = l.ln.Close()
	}
	l.ln = nil
	l.connMu.Lock()
	for c := range l.conns {
		_ = c.Close()
	}
	l.connMu.Unlock()
	l.wg.Wait()
}

func (s *server) acceptLoop(l *listener, ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		l.connsAdd(c)
		l.wg.Go(func() {
			defer func() {
				_ = c.Close()
				l.connsDel(c)
			}()
			// A client that never hangs up does not hold the connection forever.
			_ = c.SetDeadline(time.Now().Add(5 * time.Minute))
			s.serveConn(l.mode, c)
		})
	}
}

// connsAdd and connsDel track a connection under connMu, not mu: close holds mu while it waits
// for the connections' goroutines.
func (l *listener) connsAdd(c net.Conn) {
	l.connMu.Lock()
	defer l.connMu.Unlock()
	l.conns[c] = struct{}{}
}

func (l *listener) connsDel(c net.Conn) {
	l.connMu.Lock()
	defer l.connMu.Unlock()
	delete(l.conns, c)
}

func (s *server) serveConn(mode string, c net.Conn) {
	switch mode {
	case modeSilent:
		_, _ = io.Copy(io.Discard, c)
	case modeSMTP:
		if s.wedged.Load() {
			_, _ = io.Copy(io.Discard, c)
			return
		}
		smtpserver.Serve(c, s.pod)
	case modeEndlessHeaders:
		readHead(c)
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nX-A: "); err != nil {
			return
		}
		stream(c, []byte(strings.Repeat("a", 4<<10)))
	case modeHugeBody:
		readHead(c)
		if _, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\nX-Pod: %s\r\n\r\n", int64(hugeBodyLength), s.pod); err != nil {
			return
		}
		stream(c, make([]byte, 16<<10))
	}
}

// stream writes chunk until a write fails (the client hung up, or the connection's deadline).
func stream(c net.Conn, chunk []byte) {
	for {
		if _, err := c.Write(chunk); err != nil {
			return
		}
	}
}

// readHead reads up to the end of an HTTP request's head (at most 64 KiB).
func readHead(c net.Conn) {
	var got []byte
	buf := make([]byte, 4096)
	for !strings.Contains(string(got), "\r\n\r\n") && len(got) < 64<<10 {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return
		}
	}
}

func (s *server) serveHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("X-Pod", s.pod)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(int(s.status.Load()))
	_, _ = fmt.Fprintf(w, "%s\n", s.pod)
}

// controlMux is the control listener's API (see the package comment).
func (s *server) controlMux() *http.ServeMux {
	mux := http.NewServeMux()
	ok := func(w http.ResponseWriter, format string, args ...any) {
		_, _ = fmt.Fprintf(w, format+"\n", args...)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { ok(w, "ok") })
	mux.HandleFunc("POST /http/status/{code}", func(w http.ResponseWriter, r *http.Request) {
		code, err := strconv.Atoi(r.PathValue("code"))
		if err != nil || code < 200 || code > 599 {
			http.Error(w, fmt.Sprintf("status %q: want a number from 200 to 599", r.PathValue("code")), http.StatusBadRequest)
			return
		}
		s.status.Store(int32(code))
		ok(w, "http answers %d", code)
	})
	mux.HandleFunc("POST /smtp/{what}", func(w http.ResponseWriter, r *http.Request) {
		switch what := r.PathValue("what"); what {
		case "wedge", "unwedge":
			s.wedged.Store(what == "wedge")
			ok(w, "smtp %sd", what)
		case "stop", "start":
			for _, l := range s.listeners {
				if l.mode != modeSMTP {
					continue
				}
				if what == "stop" {
					l.close()
				} else if err := s.listen(l); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
			}
			ok(w, "smtp %s done", what)
		default:
			http.Error(w, fmt.Sprintf("unknown smtp action %q (wedge, unwedge, stop, start)", what), http.StatusNotFound)
		}
	})
	mux.HandleFunc("POST /grpc/status/{status}", func(w http.ResponseWriter, r *http.Request) {
		v, known := healthpb.HealthCheckResponse_ServingStatus_value[r.PathValue("status")]
		if !known {
			http.Error(w, fmt.Sprintf("status %q: want SERVING, NOT_SERVING or UNKNOWN", r.PathValue("status")), http.StatusBadRequest)
			return
		}
		service := r.URL.Query().Get("service")
		for _, l := range s.listeners {
			l.mu.Lock()
			if l.grpc != nil {
				l.grpc.Set(service, healthpb.HealthCheckResponse_ServingStatus(v))
			}
			l.mu.Unlock()
		}
		ok(w, "grpc health of %q is %s", service, r.PathValue("status"))
	})
	return mux
}
