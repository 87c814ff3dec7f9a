// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// start runs a server on loopback with the modes and a control listener; it returns the
// listeners' addresses by mode and the control address.
func start(t *testing.T, modes ...string) (map[string]string, string) {
	t.Helper()
	var args []string
	for _, m := range modes {
		args = append(args, m+"=127.0.0.1:0")
	}
	s, err := newServer("ns/pod", args)
	require.NoError(t, err)
	require.NoError(t, s.start("127.0.0.1:0"))
	t.Cleanup(s.stop)
	addrs := map[string]string{}
	for _, l := range s.listeners {
		addrs[l.mode] = l.ln.Addr().String()
		// Keep the port on stop/start: listen on the port it got.
		l.addr = addrs[l.mode]
	}
	return addrs, s.controlLn.Addr().String()
}

func post(t *testing.T, control, path string) {
	t.Helper()
	resp, err := http.Post("http://"+control+path, "", nil)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
}

func TestArguments(t *testing.T) {
	for args, want := range map[string]string{
		"":                "no MODE=ADDR given",
		"smtp":            `argument "smtp": want MODE=ADDR`,
		"gopher=:70":      `unknown mode "gopher"`,
		"http=:80 smtp=":  `argument "smtp=": want MODE=ADDR`,
		"grpc-health=:90": "",
	} {
		_, err := newServer("ns/pod", strings.Fields(args))
		if want == "" {
			assert.NoError(t, err, args)
		} else {
			assert.ErrorContains(t, err, want, args)
		}
	}
}

func TestHTTPStatusFollowsTheControl(t *testing.T) {
	addrs, control := start(t, modeHTTP)
	get := func() int {
		resp, err := http.Get("http://" + addrs[modeHTTP] + "/anything")
		require.NoError(t, err)
		_ = resp.Body.Close()
		assert.Equal(t, "ns/pod", resp.Header.Get("X-Pod"))
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, get())
	post(t, control, "/http/status/503")
	require.Equal(t, http.StatusServiceUnavailable, get())
}

func TestSMTPGreetsWedgesStopsAndStarts(t *testing.T) {
	addrs, control := start(t, modeSMTP)
	greeting := func() string {
		c, err := net.Dial("tcp", addrs[modeSMTP])
		require.NoError(t, err)
		defer func() { _ = c.Close() }()
		r := bufio.NewReader(c)
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		_, err = io.WriteString(c, "QUIT\r\n")
		require.NoError(t, err)
		bye, err := r.ReadString('\n')
		require.NoError(t, err)
		assert.Equal(t, "221 2.0.0 ns/pod closing\r\n", bye)
		return line
	}
	require.Equal(t, "220 ns/pod ESMTP testkit\r\n", greeting())

	post(t, control, "/smtp/wedge")
	c, err := net.Dial("tcp", addrs[modeSMTP])
	require.NoError(t, err, "a wedged server accepts")
	post(t, control, "/smtp/stop")
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "stop closes the wedged connection, which got no greeting")
	_ = c.Close()
	_, err = net.Dial("tcp", addrs[modeSMTP])
	require.Error(t, err, "a stopped server refuses connections")

	post(t, control, "/smtp/unwedge")
	post(t, control, "/smtp/start")
	require.Equal(t, "220 ns/pod ESMTP testkit\r\n", greeting())
}

func TestEndlessHeadersNeverEndTheHead(t *testing.T) {
	addrs, _ := start(t, modeEndlessHeaders)
	c, err := net.Dial("tcp", addrs[modeEndlessHeaders])
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	_, err = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	got := make([]byte, 1<<20)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(got), "HTTP/1.1 200 OK\r\nX-A: aaaa"))
	require.NotContains(t, string(got), "\r\n\r\n", "1 MiB and the head has not ended")
}

func TestHugeBodyAnnouncesATerabyte(t *testing.T) {
	addrs, _ := start(t, modeHugeBody)
	resp, err := http.Get("http://" + addrs[modeHugeBody] + "/")
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, int64(1<<40), resp.ContentLength)
	n, err := io.CopyN(io.Discard, resp.Body, 1<<20)
	require.NoError(t, err)
	require.Equal(t, int64(1<<20), n)
}

func TestGRPCHealthFollowsTheControl(t *testing.T) {
	addrs, control := start(t, modeGRPCHealth)
	conn, err := grpc.NewClient(addrs[modeGRPCHealth], grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		resp, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: service})
		require.NoError(t, err)
		return resp.GetStatus()
	}
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, check(""))
	post(t, control, "/grpc/status/NOT_SERVING")
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, check(""))
	post(t, control, "/grpc/status/SERVING?service=orders")
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, check("orders"))

	resp, err := http.Post("http://"+control+"/grpc/status/MAYBE", "", nil)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

func TestSilentNeverWrites(t *testing.T) {
	addrs, _ := start(t, modeSilent)
	c, err := net.Dial("tcp", addrs[modeSilent])
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	_, err = io.WriteString(c, "EHLO probe\r\n")
	require.NoError(t, err)
	// Nothing comes back: the read ends at its deadline (not EOF: the connection stays open).
	require.NoError(t, c.SetReadDeadline(time.Now().Add(500*time.Millisecond)))
	n, err := c.Read(make([]byte, 1))
	require.Zero(t, n, "the silent server wrote")
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout(), "the connection stays open and silent: %v", err)
}
