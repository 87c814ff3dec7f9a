// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// TestCiliumOnEveryNodeAnswersHealthChecksFromItsLocalEndpoints checks Options{NodeKubeProxies,
// Cilium}: every node's namespace runs its own cilium-agent (kube-proxy replacement on the
// node's eth0), a node port leads to the node's own pods only (externalTrafficPolicy: Local),
// and Cilium answers the Service's healthCheckNodePort itself from the node's active local
// backends: a node whose endpoint is not ready (FTF), terminating (FTT) or withdrawn (FFF)
// fails its check, the load balancer leaves it and sends to the other node; while it is
// terminating and serving, its node port falls back to it, so nothing fails meanwhile.
func TestCiliumOnEveryNodeAnswersHealthChecksFromItsLocalEndpoints(t *testing.T) {
	skipUnlessCilium(t)
	c := cluster.Start(t, cluster.Options{Nodes: twoZones, NodeKubeProxies: true, Cilium: true})
	assert.Zero(t, c.NodeKubeProxyPID("node-a"), "no kube-proxy on the nodes")
	ns := c.Env.CreateNamespaceForTest(t, "nodes")
	a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "a", Node: "node-a"})
	b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "b", Node: "node-b"})
	a.ServeHTTP(t, 8080)
	b.ServeHTTP(t, 8080)
	svc := createLocalLoadBalancer(t, c, ns, "web", 80, 8080)
	nodePort, hcPort := svc.Spec.Ports[0].NodePort, svc.Spec.HealthCheckNodePort
	require.Positive(t, hcPort, "the API server allocates a health check node port")
	writeSlice(t, c, ns, "web", "web-a", 8080, a.Endpoint(ready))
	writeSlice(t, c, ns, "web", "web-b", 8080, b.Endpoint(ready))

	lb := c.LoadBalancer(t, cluster.LoadBalancerOptions{HealthCheckNodePort: hcPort, NodePort: nodePort})
	require.Eventually(t, func() bool { return lb.Healthy("node-a") && lb.Healthy("node-b") }, time.Minute, 20*time.Millisecond,
		"both nodes pass: node-a %s; node-b %s", lb.Checks("node-a"), lb.Checks("node-b"))
	last := lb.Checks("node-a")[len(lb.Checks("node-a"))-1]
	assert.Equal(t, 1, last.LocalEndpoints, "Cilium's body counts node-a's one endpoint")
	assert.Equal(t, ns+"/web", last.Service)
	for node, pod := range map[string]*cluster.Pod{"node-a": a, "node-b": b} {
		res := c.Requests(t, cluster.TrafficOptions{Address: c.Node(node).IP.String(), Port: nodePort, Count: 10})
		assert.Equal(t, []string{pod.Key()}, res.Pods(), "through %s's node port: %s", node, res)
		assert.Equal(t, 10, res.OK(), "through %s: %s", node, res)
	}
	res := lb.Traffic(t, cluster.TrafficOptions{Count: 20}).Wait()
	assert.Equal(t, 20, res.OK(), "%s", res)
	assert.Equal(t, []string{a.Key(), b.Key()}, res.Pods(), "the load balancer spreads over both nodes")

	for _, tc := range []struct {
		name string
		cond discoveryv1.EndpointConditions
		// fallback: node-a's node port keeps serving from its terminating endpoint until the
		// load balancer has left (KEP-1669), so no request fails at all.
		fallback bool
	}{
		{name: "not ready, serving, not terminating (FTF)", cond: cond(false, true, false)},
		{name: "terminating and serving (FTT)", cond: cond(false, true, true), fallback: true},
		{name: "withdrawn (FFF)", cond: notReady},
	} {
		t.Run(tc.name, func(t *testing.T) {
			writeSlice(t, c, ns, "web", "web-a", 8080, a.Endpoint(ready))
			require.Eventually(t, func() bool { return lb.Healthy("node-a") }, time.Minute, 20*time.Millisecond, "node-a: %s", lb.Checks("node-a"))
			loop := lb.Traffic(t, cluster.TrafficOptions{Duration: time.Minute})
			changed := time.Now()
			writeSlice(t, c, ns, "web", "web-a", 8080, a.Endpoint(tc.cond))
			require.Eventually(t, func() bool { return !lb.Healthy("node-a") }, time.Minute, 20*time.Millisecond, "node-a: %s", lb.Checks("node-a"))
			first, ok := lb.Checks("node-a").Since(changed).FirstNotOK()
			require.True(t, ok)
			assert.Equal(t, 503, first.Status, "%s", first)
			assert.Equal(t, 0, first.LocalEndpoints, "%s", first)
			left := time.Now()
			require.Eventually(t, func() bool { return len(loop.Results().Since(left)) >= 20 }, time.Minute, 20*time.Millisecond)
			all := loop.Stop()
			if tc.fallback {
				assert.Empty(t, all.Failed(), "requests through the load balancer across the change: %s", all)
			}
			after := all.Since(left)
			assert.Empty(t, after.Failed(), "requests once node-a left: %s", after)
			assert.Equal(t, map[string]int{b.Key(): len(after)}, after.ByPod(), "once node-a left, only node-b's pod answers")
			assert.True(t, lb.Healthy("node-b"))
		})
	}
}
