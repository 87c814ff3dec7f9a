// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package dualstack_test holds the dual-stack end-to-end scenarios of issue 20: the real
// programs (two controller replicas, one agent per node, from testkit/stack) on a dual-stack
// cluster (testkit/cluster with Options.DualStack: IPv4 198.18.0.0/15 and IPv6 2001:2::/48,
// nodes with both InternalIPs, a dual-stack service range) with the real kube-proxy in nftables
// mode programming both families. Every scenario sends request loops through the ClusterIP of
// each family of its Service and asserts zero failed requests in its window.
//
// The package shares one stack between its tests (each uses its own Kubernetes namespace): a
// dual-stack stack starts in seconds, but only once. The scenarios are described in
// development/E2E.md ("Dual-stack scenarios").
package dualstack_test

import (
	"testing"
	"time"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

// shared is one dual-stack stack (API server, nodes node-a and node-b, kube-proxy, two
// controllers, two agents) for the tests. sharedCilium is the same with a dual-stack
// cilium-agent instead of kube-proxy (cilium_test.go); only one of the two runs at a time.
var shared, sharedCilium stack.Shared

// TestMain isolates the binary, stops the shared stack after the tests and fails the package if
// they leave anything. The agent-lost grace is longer than the stack's default: the upgrade
// scenario stops an agent for a moment, and nothing here is about withdrawing a lost agent's
// endpoints.
func TestMain(m *testing.M) {
	stack.MainDataplanes(m, stack.Options{
		Nodes:          []cluster.Node{{Name: "node-a", Zone: "zone-a"}, {Name: "node-b", Zone: "zone-b"}},
		DualStack:      true,
		AgentLostGrace: 30 * time.Second,
	}, &shared, &sharedCilium)
}
