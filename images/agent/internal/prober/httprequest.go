// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// The builders of an HTTP(S) probe: pure functions of the probe's fields and the pod's address,
// tested as tables (httprequest_internal_test.go). What they build is sent by probeHTTP.

// userAgent is sent unless the probe sets its own User-Agent header.
const userAgent = "service-with-healthchecks-agent"

// newHTTPRequest builds the request of an HTTP probe: method GET (the default) or HEAD, an
// absolute path ("/" by default), the probe's headers, and the Host header from host, else from
// a Host entry in headers, else the dial target as the kubelet sends it ("10.0.0.1:8080",
// "[2001:db8::1]:8080"); a bare IPv6 host is bracketed. User-Agent and Accept are added unless
// the headers set them. The request carries no address to dial: probeHTTP always dials the pod.
func newHTTPRequest(method, path, host string, headers []v1alpha1.HTTPHeader, addr netip.AddrPort) (*http.Request, error) {
	m, err := httpMethod(method)
	if err != nil {
		return nil, err
	}
	u, err := requestPath(path)
	if err != nil {
		return nil, err
	}
	req := &http.Request{
		Method:     m,
		URL:        u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     make(http.Header, len(headers)+2),
		Host:       host,
		Close:      true,
	}
	for _, hdr := range headers {
		if strings.EqualFold(hdr.Name, "Host") {
			if req.Host == "" {
				req.Host = hdr.Value
			}
			continue
		}
		req.Header.Add(hdr.Name, hdr.Value)
	}
	if req.Host == "" {
		req.Host = addr.String()
	}
	req.Host = bracketIPv6(req.Host)
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{userAgent}
	}
	if _, ok := req.Header["Accept"]; !ok {
		req.Header["Accept"] = []string{"*/*"}
	}
	return req, nil
}

// httpMethod accepts GET (also for an empty method) and HEAD, in any case.
func httpMethod(method string) (string, error) {
	switch strings.ToUpper(method) {
	case "", http.MethodGet:
		return http.MethodGet, nil
	case http.MethodHead:
		return http.MethodHead, nil
	}
	return "", fmt.Errorf("http.method %q: only GET and HEAD are allowed", method)
}

// requestPath parses the request target, which must be an absolute path; "" is "/".
func requestPath(path string) (*url.URL, error) {
	if path == "" {
		path = "/"
	}
	u, err := url.ParseRequestURI(path)
	if err != nil || !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("http.path %q is not an absolute path", path)
	}
	return u, nil
}

// isHTTPS reads the scheme: HTTP (also for an empty scheme) or HTTPS, in any case.
func isHTTPS(scheme string) (bool, error) {
	switch strings.ToUpper(scheme) {
	case "", "HTTP":
		return false, nil
	case "HTTPS":
		return true, nil
	}
	return false, fmt.Errorf("http.scheme %q: only HTTP and HTTPS are allowed", scheme)
}

// hostOnly strips a :port, and the brackets of an IPv6 literal, from a Host value:
// "example.org:8443" -> "example.org", "[2001:db8::1]:8443" and "[2001:db8::1]" ->
// "2001:db8::1".
func hostOnly(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		return h
	}
	if len(host) > 2 && host[0] == '[' && host[len(host)-1] == ']' {
		return host[1 : len(host)-1]
	}
	return host
}

// bracketIPv6 writes a Host value that is a bare IPv6 literal ("2001:db8::1", which a server
// would read as a host and a port) in brackets, as RFC 9110 and RFC 3986 ask: "[2001:db8::1]".
// Names, IPv4 addresses and values with a port are kept.
func bracketIPv6(host string) string {
	if a, err := netip.ParseAddr(host); err == nil && a.Is6() {
		return "[" + host + "]"
	}
	return host
}

// statusPasses applies the status rule: 200-399 like the kubelet, or, when successStatusCodes
// is set, exactly the listed codes and ranges. The list was validated before.
func statusPasses(code int, list []string) bool {
	if len(list) == 0 {
		return code >= 200 && code < 400
	}
	for _, e := range list {
		lo, hi, _ := parseCodeRange(e)
		if code >= lo && code <= hi {
			return true
		}
	}
	return false
}

func validateStatusCodes(list []string) error {
	for _, e := range list {
		if _, _, err := parseCodeRange(e); err != nil {
			return fmt.Errorf("http.successStatusCodes: %w", err)
		}
	}
	return nil
}

// parseCodeRange parses "418" or "400-404" without allocating.
func parseCodeRange(e string) (lo, hi int, err error) {
	a, b, isRange := strings.Cut(e, "-")
	lo, err = parseCode(a)
	if err != nil {
		return 0, 0, fmt.Errorf("%q: %w", e, err)
	}
	hi = lo
	if isRange {
		if hi, err = parseCode(b); err != nil {
			return 0, 0, fmt.Errorf("%q: %w", e, err)
		}
		if hi < lo {
			return 0, 0, fmt.Errorf("%q: range is descending", e)
		}
	}
	return lo, hi, nil
}

var errBadCode = errors.New("not a status code from 100 to 599")

func parseCode(s string) (int, error) {
	if len(s) != 3 {
		return 0, errBadCode
	}
	n := 0
	for i := 0; i < 3; i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, errBadCode
		}
		n = n*10 + int(c-'0')
	}
	if n < 100 || n > 599 {
		return 0, errBadCode
	}
	return n, nil
}
