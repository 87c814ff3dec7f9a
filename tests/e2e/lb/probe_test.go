// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package lb_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// A node whose pod fails its probe fails its health check: node-a's pod starts answering 503
// (to the agent's probe and to everyone), node-a's agent withdraws it, and node-a's kube-proxy
// answers its healthCheckNodePort with 503 and localEndpoints 0 within three times the
// decision bound, while node-b answers 200 with localEndpoints 1 throughout and a request loop
// through node-b's node port loses nothing. When the pod recovers, node-a passes again.
//
// The same scenario runs on Cilium (TestCiliumANodeWhosePodFailsItsProbeFailsItsHealthCheckWithinTheBound).
func TestANodeWhosePodFailsItsProbeFailsItsHealthCheckWithinTheBound(t *testing.T) {
	nodeFailsItsHealthCheck(t, shared.Get(t))
}

// nodeFailsItsHealthCheck is the probe-failure scenario on the stack's dataplane.
func nodeFailsItsHealthCheck(t *testing.T, s *stack.Stack) {
	c := s.Cluster
	sc := newScene(t, s, "probe")
	loop := c.Traffic(t, cluster.TrafficOptions{Address: nodeAddr(c, "node-b"), Port: sc.nodePort, Duration: loopFor})
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)

	failing := time.Now()
	sc.srvA.SetHTTPStatus(http.StatusServiceUnavailable)
	require.Eventually(t, func() bool { _, ok := sc.lb.Checks("node-a").Since(failing).FirstNotOK(); return ok }, waitFor, poll,
		"node-a fails its health check: %s", sc.lb.Checks("node-a").Since(failing))
	first, _ := sc.lb.Checks("node-a").Since(failing).FirstNotOK()
	unhealthyAfter := answeredAt(first).Sub(failing)
	assert.Equal(t, http.StatusServiceUnavailable, first.Status, "node-a answers 503: %s", first)
	assert.Equal(t, 0, first.LocalEndpoints, "kube-proxy on node-a counts no local endpoint: %s", first)
	assertProxyHealthy(t, c, first)
	assert.LessOrEqual(t, unhealthyAfter, 3*bound, "node-a answers 503 within 3 × (periodSeconds × failureThreshold + timeoutSeconds + 1 s) = %s", 3*bound)
	kit.EventuallyEndpoints(t, c, sc.ns, sc.name, map[string]map[string]string{
		"web-http-node-a": {ip(sc.a): "FFF"},
		"web-http-node-b": {ip(sc.b): "TTF"},
	})
	require.Eventually(t, func() bool { return !sc.lb.Healthy("node-a") }, waitFor, poll, "the load balancer leaves node-a")
	// From then on node-a keeps failing, node-b keeps passing.
	settled := time.Now()
	waitChecksAfter(t, sc.lb, "node-a", settled, minChecksInWindow)
	waitChecksAfter(t, sc.lb, "node-b", settled, minChecksInWindow)
	kit.WaitRequestsAfter(t, loop, settled, minInWindow)
	recovering := time.Now()
	stayed := sc.lb.Checks("node-a").Since(first.Start).Before(recovering)
	assert.Len(t, stayed.NotOK(), len(stayed), "node-a keeps failing while its pod fails: %s", stayed)
	sc.srvA.SetHTTPStatus(http.StatusOK)
	require.Eventually(t, func() bool { _, ok := sc.lb.Checks("node-a").Since(recovering).FirstOK(); return ok }, waitFor, poll,
		"node-a passes again: %s", sc.lb.Checks("node-a").Since(recovering))
	back, _ := sc.lb.Checks("node-a").Since(recovering).FirstOK()
	healthyAfter := answeredAt(back).Sub(recovering)
	assert.Equal(t, 1, back.LocalEndpoints, "kube-proxy on node-a counts the pod again: %s", back)
	assert.LessOrEqual(t, healthyAfter, 3*recoveryBound, "node-a answers 200 within 3 × (periodSeconds × successThreshold + timeoutSeconds + 1 s) = %s", 3*recoveryBound)
	done := time.Now()
	kit.WaitRequestsAfter(t, loop, done, minInWindow)
	res := loop.Stop()

	checksB := requireAllPass(t, sc.lb, "node-b", sc.healthy, done, "across the failure and the recovery")
	window := kit.RequireWindow(t, res, "node-a's failure and recovery", failing, done)
	assert.Empty(t, res.Failed(), "requests through node-b's node port: %s; failed: %s", res, e2e.Failures(res))
	assert.Equal(t, map[string]int{sc.b.Key(): res.OK()}, res.ByPod(), "node-b's node port leads to node-b's pod only (externalTrafficPolicy: Local)")
	t.Logf("node-a unhealthy %s after its pod began to fail (bound %s, asserted at %s), healthy again %s after it recovered; node-b passed %d checks; %d requests through node-b in the window, %d failed",
		unhealthyAfter.Round(time.Millisecond), bound, 3*bound, healthyAfter.Round(time.Millisecond), len(checksB), len(window), len(window.Failed()))
	figures(t, "probe failure", "unhealthy_after", unhealthyAfter, "healthy_again_after", healthyAfter, "bound", bound,
		"node_b_checks", len(checksB), "node_b_failed_checks", len(checksB.NotOK()), "requests", len(window), "failed", len(window.Failed()))
}
