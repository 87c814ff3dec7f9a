// Package postgres_test holds end-to-end scenarios 1 and 2 of issue 10: the real programs (two
// controller replicas with leader election and one agent per node, as processes, from
// testkit/stack) on the cluster harness (testkit/cluster) with a real kube-proxy, a real
// PostgreSQL 15 primary in a pod on node-a and its streaming replica in a pod on node-b, the
// db-write and db-read resources and credential Secret exactly as docs/EXAMPLES.md shows them,
// and PostgreSQL request loops through each Service's ClusterIP whose every reply names the pod
// whose server answered (cluster.PostgreSQL).
//
//  1. db-write: every new connection reaches the primary; after the replica is promoted and the
//     old primary stopped, new connections reach only the new primary within the decision
//     bound (asserted at three times it; the measured switch time is logged and benchmarked).
//  2. db-read: balances over both servers; a stopped replica leaves the read path within the
//     bound, and no request fails once it has left.
//
// The bound, the windows and what is measured are described in development/E2E.md ("PostgreSQL");
// the median switch time is in development/BENCHMARKS.md ("End-to-end: PostgreSQL switch").
package postgres_test

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
	sharedOnce sync.Once
	shared     *stack.Stack
	sharedErr  error
)

// TestMain isolates the binary (own network, mount and PID namespaces) and shares one stack
// (API server, nodes node-a and node-b, kube-proxy, two controllers, two agents) between the
// tests and the benchmark; each uses its own Kubernetes namespace and servers. Whatever they
// leave is an error.
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
// test without root (network namespaces, nftables and PostgreSQL's runuser need it).
func testStack(t testing.TB) *stack.Stack {
	t.Helper()
	cluster.SkipUnlessIsolated(t)
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		shared, sharedErr = stack.New(ctx, stack.Options{})
	})
	if errors.Is(sharedErr, cluster.ErrNotRoot) {
		t.Skipf("stack: %v", sharedErr)
	}
	require.NoError(t, sharedErr, "starting the stack")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("programs' logs (from %s):\n%s", shared.LogDir, shared.Logs(32<<10))
		}
	})
	return shared
}
