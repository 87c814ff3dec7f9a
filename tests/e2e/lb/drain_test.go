// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package lb_test

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// preStop is how long node-a's pod keeps accepting connections after its deletion begins, as a
// preStop hook (`sleep`) or an application's own drain delay would: three times the decision
// bound, the generous bound the scenarios assert. The pod stops listening then, whatever the
// test has seen.
const preStop = 3 * bound

// A node whose pod drains fails its health check before the pod stops accepting connections, so
// the load balancer leaves it in time: node-a's pod is deleted gracefully (deletionTimestamp
// set, its server still running and passing its probes), and stops listening preStop later.
// Asserted: the agent publishes it ready=false, serving=true, terminating=true; node-a's
// kube-proxy answers its health check 503 with localEndpoints 0 (it counts only ready local
// endpoints) before the pod stops, and the load balancer marks node-a unhealthy before the pod
// stops; until the pod stops node-a's node port still gives new connections to it (kube-proxy
// falls back to serving terminating local endpoints), and a keep-alive connection routed to it
// before the drain completes its next request on the draining pod; a request loop through the
// load balancer loses no request across the drain and the stop, and after the load balancer
// left node-a every request goes to node-b; node-b passes throughout.
//
// The same scenario runs on Cilium (TestCiliumALoadBalancerLeavesADrainingNodeBeforeItsPodStops).
func TestALoadBalancerLeavesADrainingNodeBeforeItsPodStops(t *testing.T) {
	loadBalancerLeavesADrainingNode(t, shared.Get(t))
}

// loadBalancerLeavesADrainingNode is the drain scenario on the stack's dataplane.
func loadBalancerLeavesADrainingNode(t *testing.T, s *stack.Stack) {
	c := s.Cluster
	sc := newScene(t, s, "drain")
	nodeA := net.JoinHostPort(nodeAddr(c, "node-a"), strconv.Itoa(int(sc.nodePort)))
	loop := sc.lb.Traffic(t, cluster.TrafficOptions{Duration: loopFor})
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)

	// A connection routed to node-a before the drain (externalTrafficPolicy: Local: node-a's pod).
	kept := newKeptConn(t, nodeA)
	pod, _, err := kept.Get(t.Context())
	require.NoError(t, err)
	require.Equal(t, sc.a.Key(), pod, "node-a's node port leads to node-a's pod")

	draining := time.Now()
	sc.a.MarkTerminating(t)
	stopAt := draining.Add(preStop)
	stopped := make(chan time.Time, 1)
	timer := time.AfterFunc(time.Until(stopAt), func() {
		sc.srvA.Stop() // the pod stops accepting connections (and closes the open ones)
		stopped <- time.Now()
	})
	t.Cleanup(func() { timer.Stop() })

	require.Eventually(t, func() bool { _, ok := sc.lb.Checks("node-a").Since(draining).FirstNotOK(); return ok }, waitFor, poll,
		"node-a fails its health check: %s", sc.lb.Checks("node-a").Since(draining))
	first, _ := sc.lb.Checks("node-a").Since(draining).FirstNotOK()
	unhealthyAt := answeredAt(first)
	assert.Equal(t, 503, first.Status, "node-a answers 503: %s", first)
	assert.Equal(t, 0, first.LocalEndpoints, "node-a's %s counts no ready local endpoint: %s", c.Dataplane(), first)
	assertProxyHealthy(t, c, first)
	require.Eventually(t, func() bool { return !sc.lb.Healthy("node-a") }, waitFor, poll, "the load balancer leaves node-a")
	changes := sc.lb.Changes("node-a")
	leftAt := changes[len(changes)-1].At
	got, err := e2e.EndpointsOf(t.Context(), c, sc.ns, sc.name)
	require.NoError(t, err)
	assert.Equal(t, map[string]map[string]string{
		"web-http-node-a": {ip(sc.a): "FTT"},
		"web-http-node-b": {ip(sc.b): "TTF"},
	}, got, "the draining pod is published not ready, serving, terminating")

	// While the pod still accepts connections: new ones through node-a's node port reach it,
	// and the connection opened before the drain completes its next request on it.
	direct := c.Requests(t, cluster.TrafficOptions{Address: nodeAddr(c, "node-a"), Port: sc.nodePort, Count: 3})
	pod, reused, err := kept.Get(t.Context())
	checkedBeforeStop := time.Now()
	require.True(t, checkedBeforeStop.Before(stopAt), "the checks of the drain ran before the pod stopped (%s after the deletion)", checkedBeforeStop.Sub(draining))
	assert.Equal(t, map[string]int{sc.a.Key(): 3}, direct.ByPod(), "node-a's node port still serves new connections with the draining pod: %s", direct)
	require.NoError(t, err, "the kept connection's request after the drain began")
	assert.True(t, reused, "the request went over the connection opened before the drain")
	assert.Equal(t, sc.a.Key(), pod, "the kept connection stays with the draining pod")
	kept.Close()

	var stoppedAt time.Time
	select {
	case stoppedAt = <-stopped:
	case <-time.After(waitFor):
		t.Fatal("the pod did not stop")
	}
	after := c.Requests(t, cluster.TrafficOptions{Address: nodeAddr(c, "node-a"), Port: sc.nodePort, Count: 1, Timeout: time.Second})
	assert.Zero(t, after.OK(), "the pod did stop: node-a's node port serves nothing: %s", after)
	kit.WaitRequestsAfter(t, loop, stoppedAt, minInWindow)
	res := loop.Stop()

	assert.True(t, unhealthyAt.Before(stoppedAt), "node-a answered 503 (%s) before the pod stopped (%s)", unhealthyAt.Format("15:04:05.000"), stoppedAt.Format("15:04:05.000"))
	assert.True(t, leftAt.Before(stoppedAt), "the load balancer left node-a (%s) before the pod stopped (%s)", leftAt.Format("15:04:05.000"), stoppedAt.Format("15:04:05.000"))
	window := kit.RequireWindow(t, res, "the drain, from the deletion to the pod's stop", draining, stoppedAt)
	assert.Empty(t, res.Failed(), "requests through the load balancer: %s; failed: %s", res, e2e.Failures(res))
	assert.ElementsMatch(t, []string{sc.a.Key(), sc.b.Key()}, res.Before(draining).Pods(), "before the drain both nodes served")
	afterLeft := res.Since(leftAt)
	assert.Equal(t, map[string]int{sc.b.Key(): len(afterLeft)}, afterLeft.ByPod(), "once it left node-a, the load balancer sends only to node-b")
	checksB := requireAllPass(t, sc.lb, "node-b", sc.healthy, stoppedAt, "across the drain")

	// The pod is gone: its slice goes, node-a keeps failing.
	sc.a.Delete(t)
	kit.EventuallyEndpoints(t, c, sc.ns, sc.name, map[string]map[string]string{"web-http-node-b": {ip(sc.b): "TTF"}})
	gone := time.Now()
	waitChecksAfter(t, sc.lb, "node-a", gone, 3)
	_, passed := sc.lb.Checks("node-a").Since(gone).FirstOK()
	assert.False(t, passed, "node-a stays unhealthy without its pod")
	assert.False(t, sc.lb.Healthy("node-a"))

	unhealthyAfter, leftAfter := unhealthyAt.Sub(draining), leftAt.Sub(draining)
	t.Logf("drain: node-a answered 503 %s after the deletion and the load balancer left it %s after; the pod stopped %s after the deletion, so node-a was unhealthy %s (left %s) before it stopped; %d requests in the drain window, %d failed; node-b passed %d checks",
		unhealthyAfter.Round(time.Millisecond), leftAfter.Round(time.Millisecond), stoppedAt.Sub(draining).Round(time.Millisecond),
		stoppedAt.Sub(unhealthyAt).Round(time.Millisecond), stoppedAt.Sub(leftAt).Round(time.Millisecond), len(window), len(window.Failed()), len(checksB))
	figures(t, "graceful drain", "unhealthy_after", unhealthyAfter, "lb_left_after", leftAfter, "pod_stopped_after", stoppedAt.Sub(draining),
		"unhealthy_before_stop", stoppedAt.Sub(unhealthyAt), "lb_left_before_stop", stoppedAt.Sub(leftAt),
		"requests", len(window), "failed", len(window.Failed()), "node_b_failed_checks", len(checksB.NotOK()))
}
