// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/prober"
)

func TestMain(m *testing.M) {
	if name := os.Getenv(hostileServerEnv); name != "" {
		os.Exit(serveHostileProcess(name))
	}
	code := m.Run()
	stopSharedPostgres()
	stopSharedMariaDB()
	if code == 0 {
		// Every probe must leave no goroutine behind.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left behind:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// logBuffer is a logr sink that keeps everything, to search it for secrets.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		fmt.Fprintln(&l.buf, prefix, args)
	}, funcr.Options{Verbosity: 10})
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func port(l net.Listener) int32 {
	return int32(l.Addr().(*net.TCPAddr).Port)
}

func tcpProbe(timeout int32) v1alpha1.Probe {
	return v1alpha1.Probe{Mode: v1alpha1.ProbeModeTCP, TimeoutSeconds: timeout,
		TCP: &v1alpha1.TCPProbe{TargetPort: intstr.FromInt32(1)}}
}

// deadlineBound is the generous bound (3x the deadline) within which a probe must give up.
func deadlineBound(timeoutSeconds int32) time.Duration {
	return 3 * time.Duration(timeoutSeconds) * time.Second
}

var netnsSeq atomic.Int32

// inNetns creates a network namespace for this test with loopback up and the nft rules given
// (an nft script), and runs fn on an OS thread that has entered it, so sockets fn creates live
// there. Needs root; the namespace is deleted when the test ends.
func inNetns(t *testing.T, nftScript string, fn func()) {
	t.Helper()
	inNetnsWith(t, nftScript, nil, fn)
}

// inNetnsWith is inNetns that also sets sysctls of the namespace (key to value, e.g.
// "net.ipv4.tcp_rmem": "4096 16384 16384"); an empty nftScript adds no rules.
func inNetnsWith(t *testing.T, nftScript string, sysctls map[string]string, fn func()) {
	t.Helper()
	inNamedNetns(t, nftScript, sysctls, func(string) { fn() })
}

// inNamedNetns is inNetnsWith whose fn gets the namespace's name, for commands that look into
// it from another goroutine (`ip netns exec <name> ...`).
func inNamedNetns(t *testing.T, nftScript string, sysctls map[string]string, fn func(name string)) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace (run as root, as CI does)")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (make deps installs iproute2 and nftables): %v", tool, err)
		}
	}
	name := "swhprober-" + strconv.Itoa(os.Getpid()) + "-" + strconv.Itoa(int(netnsSeq.Add(1)))
	run := func(stdin string, args ...string) {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), args[0], args[1:]...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%v: %s", args, out)
	}
	run("", "ip", "netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("deleting netns %s: %v: %s", name, err, out)
		}
	})
	run("", "ip", "-n", name, "link", "set", "lo", "up")
	if nftScript != "" {
		run(nftScript, "ip", "netns", "exec", name, "nft", "-f", "-")
	}

	// fn must report with assert, not require: it runs on another goroutine. done is closed even
	// if something calls runtime.Goexit there.
	done := make(chan struct{})
	var setupErr error
	go func() {
		defer close(done)
		// The thread is not unlocked: it leaves with the goroutine, so its namespace cannot leak
		// to other goroutines.
		runtime.LockOSThread()
		f, err := os.Open("/run/netns/" + name)
		if err != nil {
			setupErr = err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			setupErr = fmt.Errorf("entering netns %s: %w", name, err)
			return
		}
		// /proc/sys/net shows the network namespace of the thread that opens it: this one.
		for key, value := range sysctls {
			path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
			if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
				setupErr = fmt.Errorf("setting %s in netns %s: %w", key, name, err)
				return
			}
		}
		fn(name)
	}()
	<-done
	require.NoError(t, setupErr)
}

func newProber(opts prober.Options) *prober.Prober {
	return prober.New(opts)
}
