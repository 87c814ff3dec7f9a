// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// The controller's withdrawal of a dead node through the dataplane: node-b's agent stops; after
// the agent-lost grace the controller publishes node-b's pod ready=false, serving=false, and the
// dataplane sends every new connection to node-a's pod; the agent comes back and publishes its
// pod again. The pod itself never stops answering, so a request loop across all of it loses
// nothing: before the withdrawal it still reaches node-b's pod, after it only node-a's.
//
// The same test on Cilium: TestCiliumAStoppedAgentsNodeIsWithdrawnAndPublishedAgainWithoutAFailedRequest.
func TestAStoppedAgentsNodeIsWithdrawnAndPublishedAgainWithoutAFailedRequest(t *testing.T) {
	stoppedAgentIsWithdrawn(t, testStack(t))
}

// TestCiliumAStoppedAgentsNodeIsWithdrawnAndPublishedAgainWithoutAFailedRequest: the
// controller's withdrawal of a dead node takes its pod out of Cilium's maps.
func TestCiliumAStoppedAgentsNodeIsWithdrawnAndPublishedAgainWithoutAFailedRequest(t *testing.T) {
	stoppedAgentIsWithdrawn(t, ciliumStack(t))
}

// stoppedAgentIsWithdrawn is the scenario on the stack's dataplane.
func stoppedAgentIsWithdrawn(t *testing.T, s *stack.Stack) {
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "withdrawal")
	labels := map[string]string{"app": "web"}
	a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-a", Node: "node-a", Labels: labels, ContainerPorts: webPorts})
	b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-b", Node: "node-b", Labels: labels, ContainerPorts: webPorts})
	a.ServeHTTP(t, 8080)
	b.ServeHTTP(t, 8080)
	createResource(t, c, kit.Resource(ns, "web", labels,
		[]v1alpha1.ServicePort{e2e.ServicePort("http", 80, intstr.FromInt32(8080))},
		kit.HTTPProbe(intstr.FromInt32(8080))))
	both := map[string]map[string]string{"web-http-node-a": {ip(a): "TTF"}, "web-http-node-b": {ip(b): "TTF"}}
	kit.EventuallyEndpoints(t, c, ns, "web", both)
	c.WaitProgrammed(t, ns+"/web", 80, a, b)

	w := watchSlices(t, c, ns)
	loop := c.Traffic(t, cluster.TrafficOptions{Service: ns + "/web", Port: 80, Duration: loopFor})
	logTimelineOnFailure(t, w, loop)
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)

	// The stack is the package's: whatever happens, node-b gets its agent back.
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			_ = s.StartAgent(t.Context(), "node-b")
		}
	})
	stopped := time.Now()
	require.NoError(t, s.StopAgent(t.Context(), "node-b"))
	kit.EventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(a): "TTF"}, "web-http-node-b": {ip(b): "FFF"}})
	c.WaitProgrammed(t, ns+"/web", 80, a)
	withdrawn := time.Now()
	// The grace counts from the agent's last renewal, which may come up to one renewal interval
	// before the stop: read it from the Lease the stopped agent left behind.
	last, err := lastRenewal(t, s, "node-b")
	require.NoError(t, err)
	withdrawalSeen := firstChangeTo(w, stopped, "web-http-node-b", ip(b), "FFF")
	kit.WaitRequestsAfter(t, loop, withdrawn, minInWindow)

	restarting := time.Now()
	require.NoError(t, s.StartAgent(t.Context(), "node-b"))
	restarted = true
	kit.EventuallyEndpoints(t, c, ns, "web", both)
	c.WaitProgrammed(t, ns+"/web", 80, a, b)
	back := time.Now()
	require.Eventually(t, func() bool { return loop.Results().Since(back).ByPod()[b.Key()] > 0 }, waitFor, poll,
		"new connections reach node-b's pod again")
	res := loop.Stop()

	assert.Empty(t, res.Failed(), "requests across the withdrawal and the return: %s; failed: %s", res, e2e.Failures(res))
	assert.GreaterOrEqual(t, withdrawalSeen.Sub(last), s.Options().AgentLostGrace,
		"nothing is withdrawn before the grace since the agent's last renewal (%s, stop at %s, withdrawal seen at %s)",
		last.Format(time.StampMicro), stopped.Format(time.StampMicro), withdrawalSeen.Format(time.StampMicro))
	assert.Positive(t, between(res, stopped, withdrawn).ByPod()[b.Key()], "node-b's pod serves until it is withdrawn")
	after := between(res, withdrawn, restarting)
	assert.Equal(t, map[string]int{a.Key(): len(after)}, after.ByPod(), "while withdrawn, only node-a's pod gets new connections")
	assert.Equal(t, []string{
		"web-http-node-b: " + ip(b) + " TTF -> FFF",
		"web-http-node-b: " + ip(b) + " FFF -> TTF",
	}, about(w.ConditionChanges(), ip(b)), "node-b's pod: withdrawn, then published again")
	t.Logf("FIGURES scenario=withdrawal dataplane=%s lastRenewal->withdrawalSeen=%s stopped->programmed=%s requests=%d failed=%d", c.Dataplane(),
		withdrawalSeen.Sub(last).Round(time.Millisecond), withdrawn.Sub(stopped).Round(time.Millisecond), len(res), len(res.Failed()))
}

// firstChangeTo is when the watch first saw, after since, the address in the slice with the
// conditions.
func firstChangeTo(w *sliceWatch, since time.Time, slice, addr, conditions string) time.Time {
	for _, ch := range w.Changes() {
		if !ch.At.Before(since) && ch.Slice == slice && ch.Endpoints[addr] == conditions {
			return ch.At
		}
	}
	return time.Time{}
}
