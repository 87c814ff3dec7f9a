// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober_test

import (
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/prober"
	"github.com/deckhouse/service-with-healthchecks/testkit/pki"
)

// listenIPv6 listens on the IPv6 loopback, or skips when the machine has none.
func listenIPv6(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	return l
}

// An IPv6 pod is probed at its address, and the Host header names an IPv6 literal in
// brackets, whether it is the pod's address (the default) or the probe's host.
func TestHTTPHostOfAnIPv6PodIsBracketed(t *testing.T) {
	rec := &recorder{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.record(r)
		_, _ = io.WriteString(w, "ok")
	}))
	srv.Listener = listenIPv6(t)
	srv.Start()
	defer srv.Close()
	port := serverPort(t, srv)
	p := newProber(prober.Options{})

	cases := map[string]struct {
		host string
		want string
	}{
		"without a host the dial target is sent, bracketed":   {want: "[::1]:" + strconv.Itoa(int(port))},
		"a bare IPv6 literal host is bracketed":               {host: "2001:db8::7", want: "[2001:db8::7]"},
		"a bracketed IPv6 host with a port is kept":           {host: "[2001:db8::7]:8443", want: "[2001:db8::7]:8443"},
		"a bracketed IPv6 host is kept":                       {host: "[2001:db8::7]", want: "[2001:db8::7]"},
		"a name is kept":                                      {host: "app.example.org", want: "app.example.org"},
		"an IPv4 literal is kept":                             {host: "192.0.2.7", want: "192.0.2.7"},
		"a bare IPv6 literal in httpHeaders is bracketed too": {host: "header:2001:db8::8", want: "[2001:db8::8]"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := v1alpha1.HTTPProbe{Host: tc.host}
			if v, ok := strings.CutPrefix(tc.host, "header:"); ok {
				h = v1alpha1.HTTPProbe{HTTPHeaders: []v1alpha1.HTTPHeader{{Name: "Host", Value: v}}}
			}
			before := len(rec.requests())
			res, err := p.Probe(t.Context(), httpProbe(h), "ns", "::1", port)
			require.NoError(t, err)
			require.Equal(t, prober.Result{Outcome: prober.Success, Reason: "HTTP 200"}, res)
			reqs := rec.requests()[before:]
			require.Len(t, reqs, 1)
			assert.Equal(t, tc.want, reqs[0].Host)
		})
	}
}

// HTTPS to an IPv6 pod without a host sends no server name (an IP literal is no SNI host name)
// and checks the certificate's IP SANs for the pod's address; a host that is an IPv6 literal is
// checked the same way, without its brackets.
func TestHTTPSToAnIPv6PodChecksIPSANsAndSendsNoServerName(t *testing.T) {
	ca, err := pki.NewCA("probe-ca")
	require.NoError(t, err)
	byIP, err := ca.Server("pod", nil, []net.IP{net.ParseIP("::1"), net.ParseIP("2001:db8::7")})
	require.NoError(t, err)
	byName, err := ca.Server("app", []string{"app.example.org"}, nil)
	require.NoError(t, err)

	start := func(t *testing.T, pair pki.Pair) (*httptest.Server, func() (string, bool)) {
		cert, err := pair.TLSCertificate()
		require.NoError(t, err)
		var mu sync.Mutex
		var sni string
		var hello bool
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
		srv.Listener = listenIPv6(t)
		// GetConfigForClient sees every ClientHello, with or without a server name.
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			mu.Lock()
			sni, hello = h.ServerName, true
			mu.Unlock()
			return nil, nil
		}}
		srv.Config.ErrorLog = log.New(io.Discard, "", 0) // Rejected handshakes are expected here.
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return srv, func() (string, bool) {
			mu.Lock()
			defer mu.Unlock()
			return sni, hello
		}
	}
	ipSrv, ipSeen := start(t, byIP)
	nameSrv, nameSeen := start(t, byName)
	p := newProber(prober.Options{})

	cases := map[string]struct {
		srv    *httptest.Server
		seen   func() (string, bool)
		probe  v1alpha1.HTTPProbe
		result prober.Result
	}{
		"without host a certificate naming the pod's IPv6 address passes": {
			srv: ipSrv, seen: ipSeen, probe: v1alpha1.HTTPProbe{CACert: string(ca.CertPEM)},
			result: prober.Result{Outcome: prober.Success, Reason: "HTTP 200"},
		},
		"without host a certificate that does not name the address is rejected": {
			srv: nameSrv, seen: nameSeen, probe: v1alpha1.HTTPProbe{CACert: string(ca.CertPEM)},
			result: prober.Result{Outcome: prober.Failure, Reason: "TLS: certificate is not valid for ::1"},
		},
		"a bracketed IPv6 host is checked against the IP SANs": {
			srv: ipSrv, seen: ipSeen, probe: v1alpha1.HTTPProbe{Host: "[2001:db8::7]:8443", CACert: string(ca.CertPEM)},
			result: prober.Result{Outcome: prober.Success, Reason: "HTTP 200"},
		},
		"a bare IPv6 host is checked against the IP SANs": {
			srv: ipSrv, seen: ipSeen, probe: v1alpha1.HTTPProbe{Host: "2001:db8::7", CACert: string(ca.CertPEM)},
			result: prober.Result{Outcome: prober.Success, Reason: "HTTP 200"},
		},
		"an IPv6 host the certificate does not name is rejected": {
			srv: ipSrv, seen: ipSeen, probe: v1alpha1.HTTPProbe{Host: "[2001:db8::9]", CACert: string(ca.CertPEM)},
			result: prober.Result{Outcome: prober.Failure, Reason: "TLS: certificate is not valid for 2001:db8::9"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tc.probe.Scheme = "HTTPS"
			res, err := p.Probe(t.Context(), httpProbe(tc.probe), "ns", "::1", serverPort(t, tc.srv))
			require.NoError(t, err)
			assert.Equal(t, tc.result, res)
			sni, hello := tc.seen()
			require.True(t, hello, "the handshake reached the server")
			assert.Empty(t, sni, "an IP literal is sent as no server name")
		})
	}
}

// A TCP probe of an IPv6 pod dials its address.
func TestTCPProbesAnIPv6Pod(t *testing.T) {
	l := listenIPv6(t)
	defer func() { _ = l.Close() }()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	res, err := newProber(prober.Options{}).Probe(t.Context(), tcpProbe(1), "ns", "::1", port(l))
	require.NoError(t, err)
	assert.Equal(t, prober.Success, res.Outcome, "%s", res.Reason)
	_ = l.Close()
	res, err = newProber(prober.Options{}).Probe(t.Context(), tcpProbe(1), "ns", "::1", port(l))
	require.NoError(t, err)
	assert.Equal(t, prober.Failure, res.Outcome, "a closed port fails: %s", res.Reason)
}
