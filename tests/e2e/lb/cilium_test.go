// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package lb_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// The external load balancer scenarios on Cilium's dataplane: the same test code as their
// kube-proxy versions, on a stack whose nodes each run a real cilium-agent instead of their
// kube-proxy. Cilium answers the Service's healthCheckNodePort itself (from its active local
// backends) and routes the node ports. They run in `make test-cilium` and skip elsewhere.

// TestCiliumANodeWhosePodFailsItsProbeFailsItsHealthCheckWithinTheBound: node-a's Cilium
// answers 503 once node-a's pod fails its probe, node-b's node port loses nothing.
func TestCiliumANodeWhosePodFailsItsProbeFailsItsHealthCheckWithinTheBound(t *testing.T) {
	nodeFailsItsHealthCheck(t, sharedCilium.Get(t))
}

// TestCiliumALoadBalancerLeavesADrainingNodeBeforeItsPodStops: a draining pod's node fails
// Cilium's health check before the pod stops, its node port still serves it meanwhile (the
// terminating fallback), the load balancer's loop loses nothing.
func TestCiliumALoadBalancerLeavesADrainingNodeBeforeItsPodStops(t *testing.T) {
	loadBalancerLeavesADrainingNode(t, sharedCilium.Get(t))
}

// assertProxyHealthy checks kube-proxy's serviceProxyHealthy in a health check answer; Cilium's
// answer (pkg/loadbalancer/healthserver) has no such field.
func assertProxyHealthy(t *testing.T, c *cluster.Cluster, h cluster.HealthCheck) {
	t.Helper()
	if c.Dataplane() == cluster.DataplaneKubeProxy {
		assert.True(t, h.ServiceProxyHealthy, "kube-proxy itself is healthy: the endpoints decided: %s", h)
	}
}
