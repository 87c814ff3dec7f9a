// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package lb_test holds the end-to-end scenarios of issue 21: external load balancers see the
// drain. The real programs (two controller replicas with leader election, one agent per node,
// from testkit/stack) run on a cluster whose two nodes each have their own network namespace
// and their own kube-proxy (cluster.Options.NodeKubeProxies: nftables,
// --hostname-override=<node>), and a ServiceWithHealthchecks of type LoadBalancer with
// externalTrafficPolicy: Local has a pod on each node. A simulated cloud load balancer
// (cluster.LoadBalancer) polls each node's healthCheckNodePort over HTTP at the node's address
// every 100 ms, reads kube-proxy's JSON body (localEndpoints) and sends new connections only to
// the node ports of the nodes it considers healthy.
//
// Asserted: kube-proxy counts only ready local endpoints (hand-written slices, the real
// kube-proxy); a node whose pod fails its probe fails its health check within three times the
// decision bound while the other node passes throughout; a node whose pod drains fails its
// health check, and the load balancer leaves it, before the pod stops accepting connections,
// while connections routed to it before complete; an agent restart and a controller leader
// change never fail a node's health check. The scenarios are described in development/E2E.md
// ("External load balancers"), the measured times in development/BENCHMARKS-HISTORY.md
// ("End-to-end: external load balancers").
package lb_test

import (
	"testing"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

// shared is one stack (API server, nodes node-a and node-b with their own kube-proxies, two
// controllers, two agents) for the tests; each uses its own Kubernetes namespace. sharedCilium
// is the same with a cilium-agent on every node instead of its kube-proxy (cilium_test.go);
// only one of the two runs at a time.
var shared, sharedCilium stack.Shared

// TestMain isolates the binary (own network, mount and PID namespaces), stops the shared stack
// after the tests and fails the package if they leave anything.
func TestMain(m *testing.M) {
	stack.MainDataplanes(m, stack.Options{
		Nodes:           []cluster.Node{{Name: "node-a", Zone: "zone-a"}, {Name: "node-b", Zone: "zone-b"}},
		NodeKubeProxies: true,
	}, &shared, &sharedCilium)
}
