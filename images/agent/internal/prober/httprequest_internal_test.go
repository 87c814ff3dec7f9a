// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/netip"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/pki"
)

var (
	pod4 = netip.MustParseAddrPort("10.0.0.1:8080")
	pod6 = netip.MustParseAddrPort("[2001:db8::1]:8080")
)

func TestNewHTTPRequestBuildsWhatTheProbeSends(t *testing.T) {
	type want struct {
		method, requestURI, host string
		header                   http.Header
	}
	defaults := func(extra http.Header) http.Header {
		h := http.Header{"User-Agent": {userAgent}, "Accept": {"*/*"}}
		for k, v := range extra {
			h[k] = v
		}
		return h
	}
	cases := map[string]struct {
		method, path, host string
		headers            []v1alpha1.HTTPHeader
		addr               netip.AddrPort
		want               want
	}{
		"defaults: GET /, Host is the dial target, user agent and Accept added": {
			addr: pod4, want: want{method: "GET", requestURI: "/", host: "10.0.0.1:8080", header: defaults(nil)},
		},
		"an IPv6 pod's dial target is bracketed": {
			addr: pod6, want: want{method: "GET", requestURI: "/", host: "[2001:db8::1]:8080", header: defaults(nil)},
		},
		"HEAD in any case, a path with a query": {
			method: "head", path: "/healthz?full=1", addr: pod4,
			want: want{method: "HEAD", requestURI: "/healthz?full=1", host: "10.0.0.1:8080", header: defaults(nil)},
		},
		"get in lower case is GET": {
			method: "get", path: "/ready", addr: pod4,
			want: want{method: "GET", requestURI: "/ready", host: "10.0.0.1:8080", header: defaults(nil)},
		},
		"host sets the Host header": {
			host: "app.example.org", addr: pod4,
			want: want{method: "GET", requestURI: "/", host: "app.example.org", header: defaults(nil)},
		},
		"host with a port is kept whole": {
			host: "app.example.org:8443", addr: pod4,
			want: want{method: "GET", requestURI: "/", host: "app.example.org:8443", header: defaults(nil)},
		},
		"a bare IPv6 host is bracketed": {
			host: "2001:db8::2", addr: pod6,
			want: want{method: "GET", requestURI: "/", host: "[2001:db8::2]", header: defaults(nil)},
		},
		"a Host header is used when host is empty, and not sent as a header": {
			headers: []v1alpha1.HTTPHeader{{Name: "host", Value: "from-header.example"}}, addr: pod4,
			want: want{method: "GET", requestURI: "/", host: "from-header.example", header: defaults(nil)},
		},
		"host wins over a Host header": {
			host: "app.example.org", headers: []v1alpha1.HTTPHeader{{Name: "Host", Value: "from-header.example"}}, addr: pod4,
			want: want{method: "GET", requestURI: "/", host: "app.example.org", header: defaults(nil)},
		},
		"headers are sent, repeated ones in order": {
			headers: []v1alpha1.HTTPHeader{{Name: "X-Probe", Value: "a"}, {Name: "x-probe", Value: "b"}}, addr: pod4,
			want: want{method: "GET", requestURI: "/", host: "10.0.0.1:8080", header: defaults(http.Header{"X-Probe": {"a", "b"}})},
		},
		"the probe's User-Agent and Accept replace the defaults": {
			headers: []v1alpha1.HTTPHeader{{Name: "User-Agent", Value: "mine"}, {Name: "accept", Value: "application/json"}}, addr: pod4,
			want: want{method: "GET", requestURI: "/", host: "10.0.0.1:8080", header: http.Header{"User-Agent": {"mine"}, "Accept": {"application/json"}}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			req, err := newHTTPRequest(tc.method, tc.path, tc.host, tc.headers, tc.addr)
			require.NoError(t, err)
			assert.Equal(t, tc.want, want{method: req.Method, requestURI: req.URL.RequestURI(), host: req.Host, header: req.Header})
			// The request names no address to dial: probeHTTP always dials the pod.
			assert.Empty(t, req.URL.Host, "URL host")
			assert.Empty(t, req.URL.Scheme, "URL scheme")
			assert.True(t, req.Close, "one request per connection")
			assert.Equal(t, "HTTP/1.1", req.Proto)
		})
	}
}

func TestNewHTTPRequestRefusesInvalidInput(t *testing.T) {
	cases := map[string]struct {
		method, path string
		err          string
	}{
		"POST":                          {method: "POST", err: `http.method "POST": only GET and HEAD are allowed`},
		"a method with a space":         {method: "GET ", err: `http.method "GET ": only GET and HEAD are allowed`},
		"a relative path":               {path: "healthz", err: `http.path "healthz" is not an absolute path`},
		"an absolute URL is not a path": {path: "http://elsewhere.example/healthz", err: `http.path "http://elsewhere.example/healthz" is not an absolute path`},
		"a path with a bad escape":      {path: "/%zz", err: `http.path "/%zz" is not an absolute path`},
		"an asterisk":                   {path: "*", err: `http.path "*" is not an absolute path`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			req, err := newHTTPRequest(tc.method, tc.path, "", nil, pod4)
			require.EqualError(t, err, tc.err)
			assert.Nil(t, req)
		})
	}
}

func TestIsHTTPS(t *testing.T) {
	cases := map[string]struct {
		https bool
		err   string
	}{
		"":      {},
		"HTTP":  {},
		"http":  {},
		"HTTPS": {https: true},
		"https": {https: true},
		"FTP":   {err: `http.scheme "FTP": only HTTP and HTTPS are allowed`},
		"HTTP2": {err: `http.scheme "HTTP2": only HTTP and HTTPS are allowed`},
	}
	for scheme, tc := range cases {
		t.Run(scheme, func(t *testing.T) {
			https, err := isHTTPS(scheme)
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.https, https)
		})
	}
}

func TestTLSConfigNamesTheServerAndItsRoots(t *testing.T) {
	ca, err := pki.NewCA("probe-ca")
	require.NoError(t, err)
	cases := map[string]struct {
		host, caCert string
		pod          netip.Addr
		insecure     bool
		serverName   string
		roots        bool
		err          string
	}{
		"host is the server name":                   {host: "app.example.org", pod: pod4.Addr(), serverName: "app.example.org"},
		"host's port is not part of it":             {host: "app.example.org:8443", pod: pod4.Addr(), serverName: "app.example.org"},
		"an IPv6 host loses its brackets and port":  {host: "[2001:db8::2]:8443", pod: pod6.Addr(), serverName: "2001:db8::2"},
		"an IPv6 host in brackets without a port":   {host: "[2001:db8::2]", pod: pod6.Addr(), serverName: "2001:db8::2"},
		"without host the pod's IPv4 address":       {pod: pod4.Addr(), serverName: "10.0.0.1"},
		"without host the pod's IPv6 address":       {pod: pod6.Addr(), serverName: "2001:db8::1"},
		"insecure skips verification":               {host: "app.example.org", pod: pod4.Addr(), insecure: true, serverName: "app.example.org"},
		"caCert replaces the system roots":          {host: "app.example.org", pod: pod4.Addr(), caCert: string(ca.CertPEM), serverName: "app.example.org", roots: true},
		"a caCert without a certificate is refused": {pod: pod4.Addr(), caCert: "not a PEM", err: "caCert: no PEM certificate found"},
		"a caCert that is a key is refused": {pod: pod4.Addr(), caCert: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
			err: "caCert: no PEM certificate found"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg, err := tlsConfig(tc.host, tc.pod, tc.caCert, tc.insecure)
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				assert.Nil(t, cfg)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.serverName, cfg.ServerName)
			assert.Equal(t, tc.insecure, cfg.InsecureSkipVerify)
			assert.Equal(t, tc.roots, cfg.RootCAs != nil, "RootCAs set")
			if tc.roots {
				assert.True(t, cfg.RootCAs.Equal(ca.Pool), "RootCAs hold caCert")
			}
			assert.Equal(t, uint16(tls.VersionTLS12), cfg.MinVersion)
			assert.Empty(t, cfg.Certificates, "no client certificate")
		})
	}
}

func TestBuildHTTPProbeValidatesAndBuilds(t *testing.T) {
	cases := map[string]struct {
		probe   v1alpha1.HTTPProbe
		withTLS bool
		err     string
	}{
		"HTTP has no TLS setup":          {probe: v1alpha1.HTTPProbe{}},
		"HTTPS has one":                  {probe: v1alpha1.HTTPProbe{Scheme: "HTTPS", InsecureSkipTLSVerify: true}, withTLS: true},
		"a bad status code":              {probe: v1alpha1.HTTPProbe{SuccessStatusCodes: []string{"2xx"}}, err: `http.successStatusCodes: "2xx": not a status code from 100 to 599`},
		"a descending range":             {probe: v1alpha1.HTTPProbe{SuccessStatusCodes: []string{"204", "404-400"}}, err: `http.successStatusCodes: "404-400": range is descending`},
		"a code out of range":            {probe: v1alpha1.HTTPProbe{SuccessStatusCodes: []string{"600"}}, err: `http.successStatusCodes: "600": not a status code from 100 to 599`},
		"a bad method":                   {probe: v1alpha1.HTTPProbe{Method: "DELETE"}, err: `http.method "DELETE": only GET and HEAD are allowed`},
		"a bad path":                     {probe: v1alpha1.HTTPProbe{Path: "ready"}, err: `http.path "ready" is not an absolute path`},
		"a bad scheme":                   {probe: v1alpha1.HTTPProbe{Scheme: "WS"}, err: `http.scheme "WS": only HTTP and HTTPS are allowed`},
		"a bad caCert with HTTPS":        {probe: v1alpha1.HTTPProbe{Scheme: "HTTPS", CACert: "x"}, err: "http.caCert: no PEM certificate found"},
		"a caCert with HTTP is not used": {probe: v1alpha1.HTTPProbe{CACert: "x"}},
		"status codes are checked first": {probe: v1alpha1.HTTPProbe{SuccessStatusCodes: []string{"1"}, Method: "PUT"}, err: `http.successStatusCodes: "1": not a status code from 100 to 599`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			req, cfg, err := buildHTTPProbe(&tc.probe, pod4)
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				assert.Nil(t, req)
				assert.Nil(t, cfg)
				return
			}
			require.NoError(t, err)
			assert.NotNil(t, req)
			assert.Equal(t, tc.withTLS, cfg != nil, "TLS setup")
		})
	}
}

func TestStatusVerdict(t *testing.T) {
	cases := map[string]struct {
		code  int
		codes []string
		want  Result
	}{
		"200 passes by default":            {code: 200, want: success("HTTP 200")},
		"399 passes by default":            {code: 399, want: success("HTTP 399")},
		"199 fails by default":             {code: 199, want: failure("HTTP 199")},
		"400 fails by default":             {code: 400, want: failure("HTTP 400")},
		"a listed code passes":             {code: 418, codes: []string{"418"}, want: success("HTTP 418")},
		"a code in a listed range passes":  {code: 401, codes: []string{"200", "400-404"}, want: success("HTTP 401")},
		"the range's ends are in it":       {code: 404, codes: []string{"400-404"}, want: success("HTTP 404")},
		"200 fails when not listed":        {code: 200, codes: []string{"204"}, want: failure("HTTP 200")},
		"a code outside every range fails": {code: 405, codes: []string{"400-404", "500-599"}, want: failure("HTTP 405")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, statusVerdict(tc.code, tc.codes))
		})
	}
}

func TestResponseReason(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cases := map[string]struct {
		ctx         context.Context
		err, failed error
		want        string
	}{
		"the header bound, seen by the read under the parser": {ctx: context.Background(), err: io.ErrUnexpectedEOF, failed: errResponseHeaderLimit,
			want: "response status line and headers exceed 64 KiB (the prober's limit)"},
		"the probe's bound":              {ctx: context.Background(), err: errProbeReadLimit, want: "server sent more than 1 MiB (the prober's limit per probe)"},
		"a close before any response":    {ctx: context.Background(), err: io.EOF, want: "connection closed before a response"},
		"a close within the status line": {ctx: context.Background(), err: io.ErrUnexpectedEOF, want: "connection closed before a response"},
		"a reset under the parser":       {ctx: context.Background(), err: io.ErrUnexpectedEOF, failed: syscall.ECONNRESET, want: "reading response: connection reset by peer"},
		"a cancelled probe":              {ctx: ctx, err: context.Canceled, want: "reading response: probe cancelled"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, responseReason(tc.ctx, tc.err, tc.failed, 0))
		})
	}
}
