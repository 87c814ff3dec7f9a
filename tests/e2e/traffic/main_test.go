// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

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
// development/BENCHMARKS-HISTORY.md.
package traffic_test

import (
	"testing"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

// shared is one stack (API server, nodes node-a and node-b, kube-proxy, two controllers, two
// agents) for the tests; each test uses its own Kubernetes namespace. sharedCilium is the same
// with a real cilium-agent instead of kube-proxy, for the TestCilium... scenarios (cilium_test.go);
// only one of the two runs at a time.
var shared, sharedCilium stack.Shared

// TestMain isolates the binary (own network, mount and PID namespaces), stops the shared stack
// after the tests and fails the package if they leave anything.
func TestMain(m *testing.M) {
	stack.MainDataplanes(m, stack.Options{
		Nodes: []cluster.Node{{Name: "node-a", Zone: "zone-a"}, {Name: "node-b", Zone: "zone-b"}},
	}, &shared, &sharedCilium)
}

// testStack returns the shared stack, started by the first test that needs it; it skips the
// test without root. The test holds the stack alone until it ends: scenario 5 restarts the
// shared programs.
func testStack(t testing.TB) *stack.Stack {
	t.Helper()
	return shared.Get(t)
}

// ciliumStack is testStack with cilium-agent as the dataplane; it skips the test unless
// `make test-cilium` runs it (cluster.CiliumEnv) and stops the kube-proxy stack first.
func ciliumStack(t *testing.T) *stack.Stack {
	t.Helper()
	return sharedCilium.Get(t)
}
