// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

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
// the median switch time is in development/BENCHMARKS-HISTORY.md ("End-to-end: PostgreSQL switch").
package postgres_test

import (
	"testing"

	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

// shared is one stack (API server, nodes node-a and node-b, kube-proxy, two controllers, two
// agents) for the tests and the benchmark; each uses its own Kubernetes namespace and servers.
// sharedCilium is the same with a real cilium-agent instead of kube-proxy (cilium_test.go);
// only one of the two runs at a time.
var shared, sharedCilium stack.Shared

// TestMain isolates the binary (own network, mount and PID namespaces), stops the shared stacks
// after the tests and fails the package if they leave anything.
func TestMain(m *testing.M) { stack.MainDataplanes(m, stack.Options{}, &shared, &sharedCilium) }

// testStack returns the shared stack, started by the first test that needs it; it skips the
// test without root (network namespaces, nftables and PostgreSQL's runuser need it).
func testStack(t testing.TB) *stack.Stack {
	t.Helper()
	return shared.Get(t)
}
