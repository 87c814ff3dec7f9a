// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/prober"
)

func dialogueProbe(timeout int32, steps ...v1alpha1.TCPStep) v1alpha1.Probe {
	return v1alpha1.Probe{Mode: v1alpha1.ProbeModeTCP, TimeoutSeconds: timeout,
		TCP: &v1alpha1.TCPProbe{TargetPort: intstr.FromInt32(1), Steps: steps}}
}

func sendStep(s string) v1alpha1.TCPStep { return v1alpha1.TCPStep{Send: s} }

func prefixStep(s string) v1alpha1.TCPStep {
	return v1alpha1.TCPStep{Expect: &v1alpha1.TCPExpect{Prefix: s}}
}

func regexStep(s string) v1alpha1.TCPStep {
	return v1alpha1.TCPStep{Expect: &v1alpha1.TCPExpect{Regex: s}}
}

// smtpServer serves every connection with serve on loopback until the test ends.
func smtpServer(t *testing.T, serve func(c net.Conn)) int32 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	t.Cleanup(func() { _ = l.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				serve(c)
			}()
		}
	}()
	return port(l)
}

// greeter is an SMTP-like server: a banner, then 250 to EHLO and 221 to QUIT.
func greeter(banner string) func(net.Conn) {
	return func(c net.Conn) {
		if _, err := io.WriteString(c, banner); err != nil {
			return
		}
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			switch {
			case strings.HasPrefix(line, "EHLO"):
				_, _ = io.WriteString(c, "250-mail.example\r\n250 PIPELINING\r\n")
			case strings.HasPrefix(line, "QUIT"):
				_, _ = io.WriteString(c, "221 bye\r\n")
				return
			default:
				_, _ = io.WriteString(c, "500 what?\r\n")
			}
		}
	}
}

// wedged accepts and never greets: it reads until the client goes.
func wedged(c net.Conn) { _, _ = io.Copy(io.Discard, c) }

// endless streams a banner that never ends.
func endless(c net.Conn) {
	chunk := []byte(strings.Repeat("x", 1024))
	for {
		if _, err := c.Write(chunk); err != nil {
			return
		}
	}
}

func TestTCPDialogueAgainstSMTPLikeServers(t *testing.T) {
	tests := map[string]struct {
		serve func(net.Conn)
		steps []v1alpha1.TCPStep
		want  prober.Result
		cut   bool // the reason starts with want's: the rest depends on how the reply was segmented
	}{
		"a server that greets passes the banner check": {
			serve: greeter("220 mail.example ESMTP\r\n"),
			steps: []v1alpha1.TCPStep{prefixStep("220")},
			want:  prober.Result{Outcome: prober.Success, Reason: "replied as expected"},
		},
		"a banner, EHLO and QUIT pass as a dialogue": {
			serve: greeter("220 mail.example ESMTP\r\n"),
			steps: []v1alpha1.TCPStep{prefixStep("220"), sendStep(`EHLO probe\r\n`), regexStep(`(?m)^250 `), sendStep(`QUIT\r\n`), prefixStep("221")},
			want:  prober.Result{Outcome: prober.Success, Reason: "replied as expected (5 steps)"},
		},
		"a busy server fails with what it said": {
			serve: greeter("554 5.3.2 busy\r\n"),
			steps: []v1alpha1.TCPStep{prefixStep("220")},
			want:  prober.Result{Outcome: prober.Failure, Reason: `expected a reply starting with "220", got "554`},
			cut:   true,
		},
		"a wrong reply later in the dialogue names its step": {
			serve: greeter("220 mail.example ESMTP\r\n"),
			steps: []v1alpha1.TCPStep{prefixStep("220"), sendStep(`HELP\r\n`), prefixStep("214")},
			want:  prober.Result{Outcome: prober.Failure, Reason: `step 3: expected a reply starting with "214", got "500`},
			cut:   true,
		},
		"a server that closes before the reply matched": {
			serve: func(c net.Conn) { _, _ = io.WriteString(c, "22") },
			steps: []v1alpha1.TCPStep{prefixStep("220")},
			want:  prober.Result{Outcome: prober.Failure, Reason: `expected a reply starting with "220", got "22" and the server closed the connection`},
		},
		"a wedged server that never greets fails at the deadline": {
			serve: wedged,
			steps: []v1alpha1.TCPStep{prefixStep("220")},
			want:  prober.Result{Outcome: prober.Failure, Reason: `timeout after 1s: expected a reply starting with "220", got nothing`},
		},
		"an endless server fails at the bound of an expect": {
			serve: endless,
			steps: []v1alpha1.TCPStep{regexStep("^220")},
			want: prober.Result{Outcome: prober.Failure, Reason: `expected a reply matching /^220/ within 4 KiB (the prober's limit per expect), got "` +
				strings.Repeat("x", 64) + `"…`},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := smtpServer(t, tc.serve)
			start := time.Now()
			res, err := newProber(prober.Options{}).Probe(t.Context(), dialogueProbe(1, tc.steps...), "ns", "127.0.0.1", p)
			require.NoError(t, err)
			if tc.cut {
				assert.Equal(t, tc.want.Outcome, res.Outcome)
				assert.True(t, strings.HasPrefix(res.Reason, tc.want.Reason), "reason %q starts with %q", res.Reason, tc.want.Reason)
			} else {
				assert.Equal(t, tc.want, res)
			}
			assert.Less(t, time.Since(start), deadlineBound(1), "the probe gives up within its deadline")
		})
	}
}

// A connect alone keeps the wedged server; the banner check is what withdraws it.
func TestTheConnectOnlyProbeKeepsAWedgedServerTheBannerCheckDoesNot(t *testing.T) {
	p := smtpServer(t, wedged)
	pr := newProber(prober.Options{})
	res, err := pr.Probe(t.Context(), tcpProbe(1), "ns", "127.0.0.1", p)
	require.NoError(t, err)
	assert.Equal(t, prober.Success, res.Outcome, "connect-only: %s", res.Reason)
	res, err = pr.Probe(t.Context(), dialogueProbe(1, prefixStep("220")), "ns", "127.0.0.1", p)
	require.NoError(t, err)
	assert.Equal(t, prober.Failure, res.Outcome, "banner: %s", res.Reason)
}

func TestTCPDialogueSendsExactlyTheDecodedBytes(t *testing.T) {
	got := make(chan string, 1)
	p := smtpServer(t, func(c net.Conn) {
		b := make([]byte, 16)
		n, _ := io.ReadFull(c, b[:8])
		got <- string(b[:n])
		_, _ = io.WriteString(c, "ok")
	})
	res, err := newProber(prober.Options{}).Probe(t.Context(), dialogueProbe(1, sendStep(`A\r\n\t\\\x00`+"é"), prefixStep("ok")), "ns", "127.0.0.1", p)
	require.NoError(t, err)
	assert.Equal(t, prober.Success, res.Outcome, res.Reason)
	assert.Equal(t, "A\r\n\t\\\x00\xc3\xa9", <-got)
}

func TestTCPDialogueWithInvalidStepsIsAnErrorNotAProbe(t *testing.T) {
	tests := map[string]struct {
		step v1alpha1.TCPStep
		want string
	}{
		"a regex that RE2 refuses": {step: regexStep("role:(master"), want: "tcp.steps[0]: expect.regex is not an RE2 regular expression: error parsing regexp: missing closing ): `role:(master`"},
		"a bad escape":             {step: sendStep(`PING\q`), want: `tcp.steps[0]: "\\q" (character 5) is not an escape`},
		"an empty step":            {step: v1alpha1.TCPStep{}, want: "tcp.steps[0]: each step must set exactly one of send and expect"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := newProber(prober.Options{}).Probe(t.Context(), dialogueProbe(1, tc.step), "ns", "127.0.0.1", 1)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// redisServer is a redis-server on loopback with its own directory, stopped when the test ends.
// Extra arguments are appended (e.g. "--replicaof", "127.0.0.1", "6379").
func redisServer(t testing.TB, args ...string) int32 {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skipf("needs redis-server (make deps installs the Debian package redis-server): %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := port(l)
	require.NoError(t, l.Close())
	dir := t.TempDir()
	cmd := exec.Command(bin, append([]string{"--port", strconv.Itoa(int(p)), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no", "--logfile", dir + "/redis.log"}, args...)...)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := fmt.Sprintf("127.0.0.1:%d", p)
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		_, _ = io.WriteString(c, "PING\r\n")
		line, _ := bufio.NewReader(c).ReadString('\n')
		return line == "+PONG\r\n"
	}, 30*time.Second, 50*time.Millisecond, "redis-server on %s did not answer PING; log: %s", addr, readFile(dir+"/redis.log"))
	return p
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// The redis-write check: role:master passes on the primary and fails on its replica.
func TestTCPDialogueAgainstRealRedisPrimaryAndReplica(t *testing.T) {
	primary := redisServer(t)
	replica := redisServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(int(primary)))
	pr := newProber(prober.Options{})
	ping := dialogueProbe(1, sendStep(`PING\r\n`), prefixStep(`+PONG\r\n`))
	write := dialogueProbe(1, sendStep(`INFO replication\r\nQUIT\r\n`), regexStep(`(?m)^role:master\r$`))
	for name, p := range map[string]int32{"primary": primary, "replica": replica} {
		res, err := pr.Probe(t.Context(), ping, "ns", "127.0.0.1", p)
		require.NoError(t, err)
		assert.Equal(t, prober.Result{Outcome: prober.Success, Reason: "replied as expected (2 steps)"}, res, "PING on the %s", name)
	}
	res, err := pr.Probe(t.Context(), write, "ns", "127.0.0.1", primary)
	require.NoError(t, err)
	assert.Equal(t, prober.Success, res.Outcome, "role:master on the primary: %s", res.Reason)

	start := time.Now()
	res, err = pr.Probe(t.Context(), write, "ns", "127.0.0.1", replica)
	require.NoError(t, err)
	assert.Equal(t, prober.Failure, res.Outcome)
	assert.Contains(t, res.Reason, `step 2: expected a reply matching /(?m)^role:master\r$/, got "$`)
	assert.Contains(t, res.Reason, `role:slave`)
	// QUIT makes the server close: the replica is decided by the end of the reply, not the deadline.
	assert.Contains(t, res.Reason, "and the server closed the connection")
	assert.Less(t, time.Since(start), deadlineBound(1))
}
