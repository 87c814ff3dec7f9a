// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// TestMain runs the program itself when asked (the not-root test), otherwise the tests,
// isolated like every user of the cluster harness.
func TestMain(m *testing.M) {
	if os.Getenv("SWH_RUN_MAIN") == "1" {
		os.Exit(mainCode(os.Args[1:], os.Stdout, os.Stderr))
	}
	cluster.RunIsolated(m)
}

// The demo comes up with every example resource publishing its pods and the traffic through
// every Service's ClusterIP succeeding; a control command from "another terminal" (the control
// socket) takes effect in the view; stopping it removes the run folder.
func TestTheDemoComesUpAndReactsToAControlCommand(t *testing.T) {
	cluster.SkipUnlessIsolated(t)
	// A short path: a unix socket's path is at most 107 bytes.
	base, err := os.MkdirTemp("", "swhrun-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	runDir := filepath.Join(base, "run")
	sock := filepath.Join(runDir, "control.sock")
	d := startDemo(t, Config{Socket: sock, Plain: true, Window: 5 * time.Second, DualStack: true})
	latest, waitFor, stop := &d.latest, d.waitFor, d.stop

	waitFor(4*time.Minute, func(v *View) bool { return v.Ready }, "every resource publishes its pods and the traffic is OK")
	v := latest.Load()
	assertStartUp(t, v, d.out.String(), 9)
	wantIn := map[string][]string{"db-read": {"db-0", "db-1"}, "db-write": {"db-0"}, "smtp": {"vm-0"}, "web": {"vm-0"},
		"mysql-db-read": {"mysql-0", "mysql-1"}, "mysql-db-write": {"mysql-0"}}
	for name, pods := range wantIn {
		require.Contains(t, v.Resources, name)
		r := v.Resources[name]
		assert.Contains(t, v.Text, "\n"+name+"  ClusterIP "+r.ClusterIP+"  Ready=True\n")
		require.Len(t, r.Ports, 1)
		var in []string
		for _, p := range r.Ports[0].Pods {
			if p.In {
				in = append(in, p.Pod)
				assert.Regexp(t, `IN  `+p.Pod+` +on `+p.Node+` +`+p.Endpoint+` +ready`, v.Text)
			}
		}
		assert.Equal(t, pods, in, "%s publishes exactly these pods", name)
		sum := v.Traffic[name]
		assert.Positive(t, sum.OK, "traffic through %s", name)
		assert.Zero(t, sum.Failed, "traffic through %s", name)
		for _, p := range pods {
			assert.Positive(t, sum.ByPod[demoNamespace+"/"+p], "%s answered through %s", p, name)
		}
	}
	// The dual-stack resource: both ClusterIPs, both pods in with an endpoint of each family, and
	// traffic through each ClusterIP answered by both.
	require.Contains(t, v.Resources, dualStackResource)
	dual := v.Resources[dualStackResource]
	require.Len(t, dual.ClusterIPs, 2)
	assert.Contains(t, v.Text, "\n"+dualStackResource+"  ClusterIPs "+dual.ClusterIPs[0]+", "+dual.ClusterIPs[1]+"  Ready=True\n")
	require.Len(t, dual.Ports, 1)
	require.Len(t, dual.Ports[0].Pods, 2)
	for _, p := range dual.Ports[0].Pods {
		assert.True(t, p.In, "%s is in", p.Pod)
		assert.Regexp(t, `^[0-9.]+:8080, \[[0-9a-f:]+\]:8080$`, p.Endpoint, "%s is published over IPv4 and IPv6", p.Pod)
		assert.Contains(t, v.Text, "IN  "+p.Pod)
	}
	for _, family := range []string{"IPv4", "IPv6"} {
		sum := v.Traffic[dualStackResource+"/"+family]
		assert.Equal(t, corev1.IPFamily(family), sum.Family)
		assert.Positive(t, sum.OK, "traffic over %s", family)
		assert.Zero(t, sum.Failed, "traffic over %s", family)
		assert.Len(t, sum.ByPod, 2, "both pods answered over %s", family)
		assert.Contains(t, v.Text, "traffic http over "+family+" "+sum.Target+": ")
	}
	assert.Contains(t, v.Traffic[dualStackResource+"/IPv6"].Target, "[2001:2:", "the IPv6 loop dials the IPv6 ClusterIP")

	replica := v.Resources["db-write"].Ports[0].Pods[1]
	assert.Equal(t, "db-1", replica.Pod)
	assert.Contains(t, replica.Why, "query returned false", "the view says why the replica is out of db-write")

	var reply bytes.Buffer
	// A wedged SMTP server still accepts connections; smtp's banner check withdraws it.
	require.NoError(t, runCtl(sock, []string{"wedge-smtp"}, &reply))
	assert.Equal(t, "SMTP server of vm-0 wedged: it accepts connections and never greets\n", reply.String())
	waitFor(time.Minute, func(v *View) bool {
		smtp, web := v.Resources["smtp"].Ports[0].Pods[0], v.Resources["web"].Ports[0].Pods[0]
		return !smtp.In && strings.Contains(smtp.Why, `expected a reply starting with "220", got nothing`) && web.In
	}, "the banner check takes the wedged vm-0 out of smtp, with its reason, and keeps it in web")
	reply.Reset()
	require.NoError(t, runCtl(sock, []string{"unwedge-smtp"}, &reply))
	assert.Equal(t, "SMTP server of vm-0 greets again\n", reply.String())
	waitFor(time.Minute, func(v *View) bool { return v.Resources["smtp"].Ports[0].Pods[0].In }, "vm-0 is back in smtp once it greets")

	reply.Reset()
	require.NoError(t, runCtl(sock, []string{"stop-smtp"}, &reply))
	assert.Equal(t, "SMTP server of vm-0 stopped\n", reply.String())
	waitFor(time.Minute, func(v *View) bool {
		smtp, web := v.Resources["smtp"].Ports[0].Pods[0], v.Resources["web"].Ports[0].Pods[0]
		return !smtp.In && strings.Contains(smtp.Why, "connection refused") && web.In &&
			strings.Contains(v.Text, "OUT vm-0") && strings.Contains(v.Text, "stop-smtp: SMTP server of vm-0 stopped")
	}, "vm-0 leaves smtp with the probe's reason and stays in web")
	// A failure after the start-up is counted: smtp has no server left, so its requests fail, in
	// the window and in the count since its start-up, while web's do not.
	waitFor(time.Minute, func(v *View) bool {
		return v.Traffic["smtp"].TotalFailed > 0 && v.Traffic["smtp"].Failed > 0
	}, "the failed SMTP requests after the start-up are counted")
	v = latest.Load()
	assert.Regexp(t, `traffic smtp [0-9.]+:25: \d+ ok, [1-9]\d* failed .* · since up \d+s: \d+ ok, [1-9]\d* failed\n`, v.Text)
	assert.Zero(t, v.Traffic["web"].TotalFailed, "web kept answering")
	assert.Error(t, failedSinceStartUp(v), "a smoke run would fail now")

	// gRPC: orders-0's health answers NOT_SERVING for the probed service; it leaves grpc with the
	// probe's reason from the resource's status and stays in rest, and comes back on SERVING.
	orders := v.Resources[grpcResource]
	require.NotNil(t, orders)
	require.Len(t, orders.Ports, 2)
	for _, p := range orders.Ports {
		assert.Equal(t, 2, p.Ready, "both orders pods are in %s", p.Name)
	}
	assert.Positive(t, v.Traffic[grpcResource].OK, "gRPC traffic through orders")
	assert.Len(t, v.Traffic[grpcResource].ByPod, 2, "both orders pods answered gRPC")
	reply.Reset()
	require.NoError(t, runCtl(sock, []string{"grpc-not-serving"}, &reply))
	assert.Equal(t, "gRPC health of orders-0 answers NOT_SERVING for shop.orders.v1.Orders\n", reply.String())
	waitFor(time.Minute, func(v *View) bool {
		grpcPort, rest := v.Resources[grpcResource].Ports[0], v.Resources[grpcResource].Ports[1]
		return !grpcPort.Pods[0].In && strings.Contains(grpcPort.Pods[0].Why, `gRPC NOT_SERVING (service "shop.orders.v1.Orders")`) &&
			grpcPort.Pods[1].In && rest.Ready == 2
	}, "orders-0 leaves grpc with the status's reason and stays in rest")
	reply.Reset()
	require.NoError(t, runCtl(sock, []string{"grpc-serving"}, &reply))
	waitFor(time.Minute, func(v *View) bool { return v.Resources[grpcResource].Ports[0].Ready == 2 }, "orders-0 is back in grpc once SERVING")

	// MySQL: a failover moves mysql-db-write to mysql-1; the view says why mysql-0 is out.
	reply.Reset()
	require.NoError(t, runCtl(sock, []string{"mysql-failover"}, &reply))
	assert.Equal(t, "mysql-1 is the primary (writable); mysql-0 replicates from it (read_only=1)\n", reply.String())
	waitFor(time.Minute, func(v *View) bool {
		w := v.Resources["mysql-db-write"].Ports[0]
		return !w.Pods[0].In && strings.Contains(w.Pods[0].Why, "query returned false") && w.Pods[1].In &&
			v.Resources["mysql-db-read"].Ports[0].Ready == 2
	}, "mysql-db-write follows the failover to mysql-1, mysql-db-read keeps both")

	err = runCtl(sock, []string{"stop-agent"}, io.Discard)
	require.EqualError(t, err, "stop-agent needs NODE")

	require.NoError(t, stop(), "the demo stops cleanly")
	assert.NoDirExists(t, runDir, "the run folder and its socket are removed")
	err = runCtl(sock, []string{"stop-smtp"}, io.Discard)
	require.ErrorContains(t, err, "no demo is running")
}

// assertStartUp checks a ready view and the demo's output up to it: the start-up printed one
// line per step with its time; every one of the want traffic loops counts real requests
// (answered, none failed) since its start-up ended, and its start-up was shown apart first.
func assertStartUp(t *testing.T, v *View, out string, want int) {
	t.Helper()
	for _, step := range []string{
		"built the controller and the agent",
		"controllers ready (controller-",
		"applied docs/examples/",
	} {
		assert.Regexp(t, `(?m)^swh-run: `+regexp.QuoteMeta(step)+`.* \((\d+\.\d|\d+m\d+)s\)$`, out, "the start-up step %q says what it did and how long it took", step)
	}
	assert.Regexp(t, `(?m)^swh-run: up in (\d+\.\d|\d+m\d+)s; the view follows`, out)
	assert.Contains(t, out, ": starting (", "a view showed a traffic loop in its start-up")
	require.Len(t, v.Traffic, want)
	for name, sum := range v.Traffic {
		assert.False(t, sum.CountFrom.IsZero(), "%s counts", name)
		assert.Positive(t, sum.TotalOK, "%s: requests answered since its start-up", name)
		assert.Zero(t, sum.TotalFailed, "%s: no request failed since its start-up", name)
	}
	assert.NoError(t, failedSinceStartUp(v))
	assert.NotContains(t, v.Text, ": starting (")
	assert.Regexp(t, `· since up \d+s: [1-9]\d* ok, 0 failed\n`, v.Text)
}

// Without root the program says why in one line and exits non-zero.
func TestWithoutRootItSaysWhyInOneLine(t *testing.T) {
	if os.Geteuid() != 0 {
		var stderr bytes.Buffer
		assert.Equal(t, 1, mainCode(nil, io.Discard, &stderr))
		assert.Equal(t, notRootMessage+"\n", stderr.String())
		return
	}
	// As root: run a copy of this binary as nobody.
	dir, err := os.MkdirTemp("", "swh-run-nobody-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	bin := filepath.Join(dir, "swh-run")
	data, err := os.ReadFile(os.Args[0])
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, data, 0o755)) //nolint:gosec // an executable copy of this test binary
	cmd := exec.CommandContext(t.Context(), bin)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SWH_RUN_MAIN=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "the program fails: %v (%s)", err, stderr.String())
	assert.Equal(t, 1, exit.ExitCode())
	assert.Equal(t, notRootMessage+"\n", stderr.String())
	assert.Empty(t, stdout.String())
}

func TestParse(t *testing.T) {
	tests := map[string]struct {
		args []string
		want string
	}{
		"no flags run the demo":              {},
		"a smoke run":                        {args: []string{"--exit-after-ready", "--plain"}},
		"an IPv4-only demo":                  {args: []string{"--dual-stack=false"}},
		"a stray argument is an error":       {args: []string{"stop-smtp"}, want: `unexpected argument "stop-smtp" (the control commands are ` + "`swh-run ctl ...`)"},
		"a window below a second is refused": {args: []string{"--window=100ms"}, want: "--window 100ms: must be at least 1s"},
		"cilium as the dataplane":            {args: []string{"--dataplane=cilium"}},
		"cilium, IPv4 only":                  {args: []string{"--dataplane=cilium", "--dual-stack=false"}},
		"cilium not on real nodes":           {args: []string{"--dataplane=cilium", "--nodes=real"}, want: "--dataplane=cilium: not with --nodes=real (cilium-agent runs in the cluster namespace as the simulated nodes' datapath)"},
		"an unknown dataplane is refused":    {args: []string{"--dataplane=calico"}, want: `--dataplane "calico": want kube-proxy or cilium`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := parse(tc.args, io.Discard)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tc.want)
		})
	}
}

func TestHelpListsEveryCommand(t *testing.T) {
	h := helpText()
	for name := range commands {
		assert.Contains(t, h, "  "+name, "help names %s", name)
	}
}

// syncBuffer is a bytes.Buffer the demo and the test may share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// demoRun is a demo started by a test: its latest view, and how to wait for one and stop it.
type demoRun struct {
	t      *testing.T
	latest atomic.Pointer[View]
	out    syncBuffer
	done   chan struct{}
	cancel context.CancelFunc
	err    error
}

// startDemo runs the demo with cfg (its Out and OnView set here) until the test ends; a failed
// test logs the demo's output.
func startDemo(t *testing.T, cfg Config) *demoRun {
	t.Helper()
	d := &demoRun{t: t, done: make(chan struct{})}
	cfg.Out, cfg.OnView = &d.out, func(v *View) { d.latest.Store(v) }
	ctx, cancel := context.WithCancel(t.Context())
	d.cancel = cancel
	go func() {
		d.err = run(ctx, cfg)
		close(d.done)
	}()
	t.Cleanup(func() {
		_ = d.stop()
		if t.Failed() {
			t.Logf("the demo's output:\n%s", d.out.String())
		}
	})
	return d
}

// stop ends the demo and returns what run returned.
func (d *demoRun) stop() error {
	d.cancel()
	<-d.done
	return d.err
}

// waitFor polls cond on the latest view and fails at once when the demo ended.
func (d *demoRun) waitFor(timeout time.Duration, cond func(v *View) bool, msg string) {
	d.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-d.done:
			d.t.Fatalf("the demo ended early: %v", d.err)
		default:
		}
		if v := d.latest.Load(); v != nil && cond(v) {
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("%s: not within %s; the last view:\n%s", msg, timeout, d.latest.Load().textOrNone())
		}
		time.Sleep(200 * time.Millisecond)
	}
}
