// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/prober"
	"github.com/deckhouse/service-with-healthchecks/testkit/pki"
)

func httpProbe(h v1alpha1.HTTPProbe) v1alpha1.Probe {
	h.TargetPort = intstr.FromInt32(1)
	return v1alpha1.Probe{Mode: v1alpha1.ProbeModeHTTP, TimeoutSeconds: 1, HTTP: &h}
}

// recorder is an HTTP server that remembers the requests it served.
type recorder struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (r *recorder) record(req *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, req)
}

func (r *recorder) requests() []*http.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*http.Request(nil), r.reqs...)
}

func serverPort(t *testing.T, s *httptest.Server) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(s.Listener.Addr().String())
	require.NoError(t, err)
	n, err := strconv.Atoi(p)
	require.NoError(t, err)
	return int32(n)
}

func TestHTTPStatusCodes(t *testing.T) {
	rec := &recorder{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.record(r)
		code, err := strconv.Atoi(r.URL.Query().Get("code"))
		if err != nil {
			code = 200
		}
		if code >= 300 && code < 400 {
			w.Header().Set("Location", "/target")
		}
		w.WriteHeader(code)
		_, _ = io.WriteString(w, "body")
	}))
	defer srv.Close()
	p := newProber(prober.Options{})

	cases := map[string]struct {
		code    int
		list    []string
		outcome prober.Outcome
	}{
		"200 passes":                                 {code: 200, outcome: prober.Success},
		"204 passes":                                 {code: 204, outcome: prober.Success},
		"a redirect passes and is not followed":      {code: 302, outcome: prober.Success},
		"399 passes":                                 {code: 399, outcome: prober.Success},
		"404 fails":                                  {code: 404, outcome: prober.Failure},
		"500 fails":                                  {code: 500, outcome: prober.Failure},
		"503 fails":                                  {code: 503, outcome: prober.Failure},
		"a listed code passes":                       {code: 418, list: []string{"418"}, outcome: prober.Success},
		"a code in a listed range passes":            {code: 403, list: []string{"200-299", "400-404"}, outcome: prober.Success},
		"with a list, only the list passes":          {code: 302, list: []string{"200-299"}, outcome: prober.Failure},
		"with a list, a code outside it fails":       {code: 405, list: []string{"200-299", "400-404"}, outcome: prober.Failure},
		"the list can include the default range too": {code: 301, list: []string{"200-399", "503"}, outcome: prober.Success},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			path := "/check?code=" + strconv.Itoa(tc.code)
			before := len(rec.requests())
			res, err := p.Probe(t.Context(), httpProbe(v1alpha1.HTTPProbe{Path: path, SuccessStatusCodes: tc.list}),
				"ns", "127.0.0.1", serverPort(t, srv))
			require.NoError(t, err)
			require.Equal(t, prober.Result{Outcome: tc.outcome, Reason: fmt.Sprintf("HTTP %d", tc.code)}, res)
			reqs := rec.requests()[before:]
			require.Len(t, reqs, 1, "exactly one request, no redirect followed")
			require.Equal(t, path, reqs[0].URL.RequestURI())
		})
	}
	for _, r := range rec.requests() {
		require.NotEqual(t, "/target", r.URL.Path, "a redirect must not be followed")
	}

	_, err := p.Probe(t.Context(), httpProbe(v1alpha1.HTTPProbe{SuccessStatusCodes: []string{"2xx"}}), "ns", "127.0.0.1", serverPort(t, srv))
	require.Error(t, err, "an invalid status code list is invalid input, not a failure")
}

func TestHTTPSendsMethodHeadersAndHostButDialsThePod(t *testing.T) {
	rec := &recorder{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.record(r)
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	p := newProber(prober.Options{})
	addr := srv.Listener.Addr().String()

	cases := map[string]struct {
		probe  v1alpha1.HTTPProbe
		method string
		host   string
		check  func(t *testing.T, r *http.Request)
	}{
		"without host the Host header is the pod address": {
			probe: v1alpha1.HTTPProbe{}, method: "GET", host: addr,
			check: func(t *testing.T, r *http.Request) {
				assert.Equal(t, "/", r.URL.Path)
				assert.Equal(t, "service-with-healthchecks-agent", r.UserAgent())
				assert.True(t, r.Close, "the probe asks the server to close the connection")
			},
		},
		"host sets the Host header but the probe still dials the pod IP": {
			// example.invalid cannot resolve: reaching the server proves the dial target is the pod.
			probe: v1alpha1.HTTPProbe{Host: "app.example.invalid:8443", Path: "/healthz?full=1"}, method: "GET", host: "app.example.invalid:8443",
			check: func(t *testing.T, r *http.Request) { assert.Equal(t, "/healthz?full=1", r.URL.RequestURI()) },
		},
		"HEAD is sent as HEAD": {
			probe: v1alpha1.HTTPProbe{Method: "HEAD"}, method: "HEAD", host: addr,
		},
		"headers reach the server": {
			probe: v1alpha1.HTTPProbe{HTTPHeaders: []v1alpha1.HTTPHeader{
				{Name: "X-Probe", Value: "one"}, {Name: "X-Probe", Value: "two"}, {Name: "User-Agent", Value: "custom"},
			}},
			method: "GET", host: addr,
			check: func(t *testing.T, r *http.Request) {
				assert.Equal(t, []string{"one", "two"}, r.Header.Values("X-Probe"))
				assert.Equal(t, "custom", r.UserAgent())
			},
		},
		"a Host header in httpHeaders sets the Host when host is empty": {
			probe:  v1alpha1.HTTPProbe{HTTPHeaders: []v1alpha1.HTTPHeader{{Name: "host", Value: "from-header.example"}}},
			method: "GET", host: "from-header.example",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			before := len(rec.requests())
			res, err := p.Probe(t.Context(), httpProbe(tc.probe), "ns", "127.0.0.1", serverPort(t, srv))
			require.NoError(t, err)
			require.Equal(t, prober.Result{Outcome: prober.Success, Reason: "HTTP 200"}, res)
			reqs := rec.requests()[before:]
			require.Len(t, reqs, 1)
			assert.Equal(t, tc.method, reqs[0].Method)
			assert.Equal(t, tc.host, reqs[0].Host)
			if tc.check != nil {
				tc.check(t, reqs[0])
			}
		})
	}
}

func TestHTTPReadsOnlyABoundedPartOfAHugeBody(t *testing.T) {
	const bodySize = 100 << 20
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	written := make(chan int64, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			written <- -1
			return
		}
		defer c.Close()
		// A small fixed send buffer, so what the server counts as written is close to what the
		// client took (the kernel does not buffer megabytes on the server's side).
		_ = c.(*net.TCPConn).SetWriteBuffer(32 << 10)
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 4096)
		_, _ = c.Read(buf) // The request.
		_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", bodySize)
		chunk := make([]byte, 16<<10)
		var n int64
		for n < bodySize {
			m, err := c.Write(chunk)
			n += int64(m)
			if err != nil {
				break
			}
		}
		written <- n
	}()

	res, err := newProber(prober.Options{}).Probe(t.Context(), httpProbe(v1alpha1.HTTPProbe{}), "ns", "127.0.0.1", port(l))
	require.NoError(t, err)
	require.Equal(t, prober.Result{Outcome: prober.Success, Reason: "HTTP 200"}, res)
	n := <-written
	require.Positive(t, n, "the server sent part of the body")
	require.Less(t, n, int64(1<<20), "the client must hang up after less than 1 MiB of a 100 MB body")
}

func TestHTTPServerThatNeverAnswersIsCutAtTheDeadline(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c // Read nothing, answer nothing.
		}
	}()

	start := time.Now()
	res, err := newProber(prober.Options{}).Probe(t.Context(), httpProbe(v1alpha1.HTTPProbe{}), "ns", "127.0.0.1", port(l))
	elapsed := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, prober.Result{Outcome: prober.Failure, Reason: "reading response: timeout after 1s"}, res)
	require.Less(t, elapsed, deadlineBound(1))
	c := <-accepted // The connection was made: the deadline, not a refusal, ended the probe.
	_ = c.Close()
}

func TestHTTPS(t *testing.T) {
	ca, err := pki.NewCA("probe-ca")
	require.NoError(t, err)
	otherCA, err := pki.NewCA("other-ca")
	require.NoError(t, err)
	byName, err := ca.Server("app", []string{"app.example.org"}, nil)
	require.NoError(t, err)
	byIP, err := ca.Server("pod", nil, []net.IP{net.ParseIP("127.0.0.1")})
	require.NoError(t, err)

	type seen struct{ sni, host string }
	start := func(t *testing.T, pair pki.Pair) (*httptest.Server, chan seen) {
		ch := make(chan seen, 10)
		cert, err := pair.TLSCertificate()
		require.NoError(t, err)
		var sni string
		var mu sync.Mutex
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			ch <- seen{sni: sni, host: r.Host}
			mu.Unlock()
		}))
		// Certificates serves clients that send no SNI (an IP as server name); GetCertificate
		// records the SNI of the others. httptest would add its own certificate otherwise.
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			mu.Lock()
			sni = h.ServerName
			mu.Unlock()
			return &cert, nil
		}}
		srv.Config.ErrorLog = log.New(io.Discard, "", 0) // Rejected handshakes are expected here.
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return srv, ch
	}
	nameSrv, nameSeen := start(t, byName)
	ipSrv, ipSeen := start(t, byIP)
	p := newProber(prober.Options{})

	cases := map[string]struct {
		srv    *httptest.Server
		seen   chan seen
		probe  v1alpha1.HTTPProbe
		result prober.Result
		want   *seen
	}{
		"a certificate signed by caCert for host passes, with SNI and Host from host": {
			srv: nameSrv, seen: nameSeen,
			probe:  v1alpha1.HTTPProbe{Host: "app.example.org", CACert: string(ca.CertPEM)},
			result: prober.Result{Outcome: prober.Success, Reason: "HTTP 200"},
			want:   &seen{sni: "app.example.org", host: "app.example.org"},
		},
		"a host with a port sends SNI without it": {
			srv: nameSrv, seen: nameSeen,
			probe:  v1alpha1.HTTPProbe{Host: "app.example.org:8443", CACert: string(ca.CertPEM)},
			result: prober.Result{Outcome: prober.Success, Reason: "HTTP 200"},
			want:   &seen{sni: "app.example.org", host: "app.example.org:8443"},
		},
		"a certificate of another CA is rejected": {
			srv: nameSrv, seen: nameSeen,
			probe:  v1alpha1.HTTPProbe{Host: "app.example.org", CACert: string(otherCA.CertPEM)},
			result: prober.Result{Outcome: prober.Failure, Reason: "TLS: certificate signed by unknown authority"},
		},
		"a certificate for another name is rejected": {
			srv: nameSrv, seen: nameSeen,
			probe:  v1alpha1.HTTPProbe{Host: "other.example.org", CACert: string(ca.CertPEM)},
			result: prober.Result{Outcome: prober.Failure, Reason: "TLS: certificate is not valid for other.example.org"},
		},
		"skip-verify accepts a certificate of an unknown CA": {
			srv: nameSrv, seen: nameSeen,
			probe:  v1alpha1.HTTPProbe{Host: "whatever.example", InsecureSkipTLSVerify: true},
			result: prober.Result{Outcome: prober.Success, Reason: "HTTP 200"},
			want:   &seen{sni: "whatever.example", host: "whatever.example"},
		},
		"without host the certificate must name the pod IP": {
			srv: ipSrv, seen: ipSeen,
			probe:  v1alpha1.HTTPProbe{CACert: string(ca.CertPEM)},
			result: prober.Result{Outcome: prober.Success, Reason: "HTTP 200"},
		},
		"without host a certificate that does not name the pod IP is rejected": {
			srv: nameSrv, seen: nameSeen,
			probe:  v1alpha1.HTTPProbe{CACert: string(ca.CertPEM)},
			result: prober.Result{Outcome: prober.Failure, Reason: "TLS: certificate is not valid for 127.0.0.1"},
		},
		"plain HTTP to a TLS port fails with the status of the TLS error page": {
			srv: nameSrv, seen: nameSeen,
			probe:  v1alpha1.HTTPProbe{Scheme: corev1.URISchemeHTTP},
			result: prober.Result{Outcome: prober.Failure, Reason: "HTTP 400"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if tc.probe.Scheme == "" {
				tc.probe.Scheme = corev1.URISchemeHTTPS
			}
			res, err := p.Probe(t.Context(), httpProbe(tc.probe), "ns", "127.0.0.1", serverPort(t, tc.srv))
			require.NoError(t, err)
			require.Equal(t, tc.result, res)
			if tc.result.Outcome == prober.Success {
				got := <-tc.seen
				if tc.want != nil {
					require.Equal(t, *tc.want, got)
				}
			}
		})
	}
}

func TestOneProberRunsManyProbesAtOnce(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		code, _ := strconv.Atoi(r.URL.Query().Get("code"))
		w.WriteHeader(code)
	}))
	defer srv.Close()
	p := newProber(prober.Options{})
	const workers, each = 16, 10
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Half the workers expect a pass, half a failure: results must not cross.
			code := 200 + 300*(w%2)
			for range each {
				res, err := p.Probe(t.Context(), httpProbe(v1alpha1.HTTPProbe{Path: "/?code=" + strconv.Itoa(code)}), "ns", "127.0.0.1", serverPort(t, srv))
				switch {
				case err != nil:
					errs <- err
				case res.Reason != "HTTP "+strconv.Itoa(code):
					errs <- fmt.Errorf("worker %d got %+v", w, res)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.Equal(t, int64(workers*each), hits.Load())
}

func TestCancellingTheCallersContextEndsTheProbeAtOnce(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			_, _ = c.Read(make([]byte, 4096)) // The request; it is never answered.
			accepted <- c
		}
	}()
	ctx, cancel := context.WithCancel(t.Context())
	results := make(chan prober.Result, 1)
	go func() {
		probe := httpProbe(v1alpha1.HTTPProbe{})
		probe.TimeoutSeconds = 60
		res, err := newProber(prober.Options{}).Probe(ctx, probe, "ns", "127.0.0.1", port(l))
		assert.NoError(t, err)
		results <- res
	}()
	c := <-accepted // The probe is waiting for the response now.
	defer c.Close()
	cancel()
	// The reason, not a clock, proves that the cancellation ended the probe: its own deadline
	// (60 s) would say "timeout after 1m0s".
	res := <-results
	require.Equal(t, prober.Result{Outcome: prober.Failure, Reason: "reading response: probe cancelled"}, res)
}

// The HTTP prober reuses its read and write buffers from probe to probe. A pod that answers
// with more than one response (here a failing one, then a passing one the reader takes in with
// it) must not answer the next pod's probe: probed in turn with a pod that reads the request and
// hangs up, each keeps its own verdict, and the second pod receives exactly one request, no
// bytes of the first probe's.
func TestHTTPReusedBuffersCarryNothingFromOneProbeToTheNext(t *testing.T) {
	const twoAnswers = "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n" +
		"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
	chatty, err := startHostile(func(c *countingConn) error {
		readHTTPRequest(c)
		if _, err := c.Write([]byte(twoAnswers)); err != nil {
			return err
		}
		readOnce(c) // until the prober hangs up
		return nil
	})
	require.NoError(t, err)
	defer chatty.close()
	var (
		mu       sync.Mutex
		requests []string
	)
	silent, err := startHostile(func(c *countingConn) error {
		got := readHTTPRequest(c)
		mu.Lock()
		requests = append(requests, string(got))
		mu.Unlock()
		return nil // hangs up without answering
	})
	require.NoError(t, err)
	defer silent.close()

	p := newProber(prober.Options{})
	const rounds = 20
	for range rounds {
		res, err := p.Probe(t.Context(), httpProbe(v1alpha1.HTTPProbe{}), "ns", "127.0.0.1", chatty.port())
		require.NoError(t, err)
		require.Equal(t, prober.Result{Outcome: prober.Failure, Reason: "HTTP 500"}, res, "the first answer decides")
		res, err = p.Probe(t.Context(), httpProbe(v1alpha1.HTTPProbe{}), "ns", "127.0.0.1", silent.port())
		require.NoError(t, err)
		require.Equal(t, prober.Result{Outcome: prober.Failure, Reason: "connection closed before a response"}, res,
			"the other pod's second answer stays with its probe")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, requests, rounds)
	for _, r := range requests {
		assert.True(t, strings.HasPrefix(r, "GET / HTTP/1.1\r\n"), "a request as sent, nothing before it: %q", r)
		assert.Equal(t, 1, strings.Count(r, "HTTP/1.1\r\n"), "one request per connection: %q", r)
	}
}
