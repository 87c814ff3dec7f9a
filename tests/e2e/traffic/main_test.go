// Package traffic_test holds end-to-end scenarios 3 to 6 of issue 10: the real programs (two
// controller replicas with leader election, one agent per node, as processes, from
// testkit/stack) on the cluster harness (testkit/cluster) with a real kube-proxy, and request
// loops through each Service's ClusterIP that must see zero failed requests while something
// happens: an SMTP server stops on a "VM" pod (its web port goes on), a pod is drained and
// replaced, agents and the controller leader restart, a live Service is adopted.
//
// Each loop spans its event by timestamps and must send at least minInWindow requests inside
// the window; "zero failed requests" is exactly zero. The scenarios and what they simulate are
// described in development/E2E.md ("Traffic scenarios"); the counts of several runs are in
// development/BENCHMARKS.md.
package traffic_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

var (
	sharedOnce  sync.Once
	shared      *stack.Stack
	sharedErr   error
	sharedMu    sync.Mutex // serialises the tests' use of the shared programs
	stackLogDir string
)

// TestMain isolates the binary (own network, mount and PID namespaces) and shares one stack
// (API server, nodes node-a and node-b, kube-proxy, two controllers, two agents) between the
// tests; each test uses its own Kubernetes namespace. Whatever the tests leave is an error.
func TestMain(m *testing.M) {
	cluster.Isolate()
	code := m.Run()
	if shared != nil {
		if err := shared.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the stack:", err)
			code = 1
		}
	}
	if cluster.Isolated() {
		if left := cluster.Leftovers(); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "left over after the tests:\n  %s\n", strings.Join(left, "\n  "))
			code = 1
		}
	}
	os.Exit(code)
}

// testStack returns the shared stack, started by the first test that needs it; it skips the
// test without root. The tests of this package do not run in parallel: scenario 5 restarts the
// shared programs.
func testStack(t *testing.T) *stack.Stack {
	t.Helper()
	cluster.SkipUnlessIsolated(t)
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		shared, sharedErr = stack.New(ctx, stack.Options{
			Nodes: []cluster.Node{{Name: "node-a", Zone: "zone-a"}, {Name: "node-b", Zone: "zone-b"}},
		})
		if shared != nil {
			stackLogDir = shared.LogDir
		}
	})
	if errors.Is(sharedErr, cluster.ErrNotRoot) {
		t.Skipf("stack: %v", sharedErr)
	}
	require.NoError(t, sharedErr, "starting the stack")
	sharedMu.Lock()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("programs' logs (from %s):\n%s", stackLogDir, shared.Logs(32<<10))
		}
		sharedMu.Unlock()
	})
	return shared
}
