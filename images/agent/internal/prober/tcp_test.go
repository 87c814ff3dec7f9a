// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/prober"
)

func TestTCPConnectsSendsNothingAndResets(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	type read struct {
		n   int
		err error
	}
	reads := make(chan read, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			reads <- read{err: err}
			return
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 1024)
		n, err := c.Read(buf)
		reads <- read{n: n, err: err}
	}()

	res, err := newProber(prober.Options{}).Probe(t.Context(), tcpProbe(1), "ns", "127.0.0.1", port(l))
	require.NoError(t, err)
	require.Equal(t, prober.Result{Outcome: prober.Success, Reason: "connected"}, res)

	r := <-reads
	require.Equal(t, 0, r.n, "the probe must send nothing")
	// SO_LINGER 0: the close is a reset, so the probing side keeps no TIME-WAIT socket (a
	// normal close would show up here as io.EOF).
	require.ErrorIs(t, r.err, syscall.ECONNRESET)
}

func TestTCPRefusedPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := port(l)
	require.NoError(t, l.Close()) // Nothing listens on p now.

	res, err := newProber(prober.Options{}).Probe(t.Context(), tcpProbe(1), "ns", "127.0.0.1", p)
	require.NoError(t, err)
	require.Equal(t, prober.Result{Outcome: prober.Failure, Reason: "connection refused"}, res)
}

func TestTCPPortWhoseSYNsAreDroppedIsCutAtTheDeadline(t *testing.T) {
	const dropped, open = 7001, 7002
	inNetns(t, `table inet swh_test {
  chain input {
    type filter hook input priority 0;
    tcp dport 7001 tcp flags syn drop
  }
}
`, func() {
		// The same namespace answers on another port: the namespace itself works.
		l, err := net.Listen("tcp", "127.0.0.1:7002")
		if !assert.NoError(t, err) {
			return
		}
		defer l.Close()
		res, err := newProber(prober.Options{}).Probe(t.Context(), tcpProbe(1), "ns", "127.0.0.1", open)
		assert.NoError(t, err)
		assert.Equal(t, prober.Success, res.Outcome, res.Reason)

		start := time.Now()
		res, err = newProber(prober.Options{}).Probe(t.Context(), tcpProbe(1), "ns", "127.0.0.1", dropped)
		elapsed := time.Since(start)
		assert.NoError(t, err)
		assert.Equal(t, prober.Result{Outcome: prober.Failure, Reason: "timeout after 1s"}, res)
		assert.Less(t, elapsed, deadlineBound(1), "the deadline must cut the connect")
	})
}

func TestInvalidInputIsAnErrorNotAFailure(t *testing.T) {
	p := newProber(prober.Options{})
	cases := map[string]struct {
		ip   string
		port int32
	}{
		"a pod IP that is not an IP": {ip: "pod.example", port: 80},
		"a port of zero":             {ip: "127.0.0.1", port: 0},
		"a port above 65535":         {ip: "127.0.0.1", port: 70000},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := p.Probe(t.Context(), tcpProbe(1), "ns", tc.ip, tc.port)
			require.Error(t, err)
		})
	}
}

// timeWaitSockets counts the TIME-WAIT sockets of either side of connections to port.
func timeWaitSockets(t *testing.T, port int32) int {
	t.Helper()
	p := strconv.Itoa(int(port))
	out, err := exec.Command("ss", "-Htan", "state", "time-wait", "( dport = :"+p+" or sport = :"+p+" )").CombinedOutput()
	require.NoError(t, err, "ss: %s", out)
	s := strings.TrimSpace(string(out))
	if s == "" {
		return 0
	}
	return len(strings.Split(s, "\n"))
}

func TestProbesLeaveNoTimeWaitSockets(t *testing.T) {
	if _, err := exec.LookPath("ss"); err != nil {
		t.Skipf("needs ss (iproute2, make deps): %v", err)
	}
	const n = 20
	tcpTarget := func(t *testing.T) int32 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
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
	httpTarget := func(t *testing.T) int32 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
		t.Cleanup(srv.Close)
		return serverPort(t, srv)
	}
	p := newProber(prober.Options{})

	t.Run("a plain dial and close leaves them, so ss would see ours", func(t *testing.T) {
		port := tcpTarget(t)
		for range n {
			c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(int(port)))
			require.NoError(t, err)
			require.NoError(t, c.Close())
		}
		require.Eventually(t, func() bool { return timeWaitSockets(t, port) >= n }, 10*time.Second, 10*time.Millisecond)
	})
	cases := map[string]struct {
		target func(t *testing.T) int32
		probe  v1alpha1.Probe
	}{
		"TCP probes":  {target: tcpTarget, probe: tcpProbe(1)},
		"HTTP probes": {target: httpTarget, probe: httpProbe(v1alpha1.HTTPProbe{})},
	}
	for name, tc := range cases {
		t.Run(name+" leave none", func(t *testing.T) {
			port := tc.target(t)
			for range n {
				res, err := p.Probe(t.Context(), tc.probe, "ns", "127.0.0.1", port)
				require.NoError(t, err)
				require.Equal(t, prober.Success, res.Outcome, res.Reason)
			}
			require.Zero(t, timeWaitSockets(t, port))
		})
	}
}
