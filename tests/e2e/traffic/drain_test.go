// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import (
	"strings"
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

// Scenario 4: graceful drain. A pod is replaced the way a rolling update replaces it: the new
// pod starts and is published, then the old one is deleted gracefully (deletionTimestamp set,
// its server still running, as during a preStop hook or a terminationGracePeriod) and only
// later removed. While terminating, the old pod keeps passing its probes and is published as
// ready=false, serving=true, terminating=true (DESIGN §3), so kube-proxy sends new connections
// only to the new pod. A steady request loop across the whole replacement sees zero failures.
//
// The same scenario runs on Cilium (TestCiliumAPodReplacedWithAGracefulDrainLosesNoRequest).
func TestAPodReplacedWithAGracefulDrainLosesNoRequest(t *testing.T) {
	gracefulReplacementLosesNoRequest(t, testStack(t))
}

// gracefulReplacementLosesNoRequest is scenario 4 on the stack's dataplane.
func gracefulReplacementLosesNoRequest(t *testing.T, s *stack.Stack) {
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "drain")
	labels := map[string]string{"app": "shop"}
	old := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "shop-old", Node: "node-a", Labels: labels, ContainerPorts: webPorts})
	oldServer := old.ServeHTTP(t, 8080)
	createResource(t, c, kit.Resource(ns, "shop", labels,
		[]v1alpha1.ServicePort{e2e.ServicePort("http", 80, intstr.FromString("http"))},
		kit.HTTPProbe(intstr.FromString("http"))))
	kit.EventuallyEndpoints(t, c, ns, "shop", map[string]map[string]string{"shop-http-node-a": {ip(old): "TTF"}})
	c.WaitProgrammed(t, ns+"/shop", 80, old)
	w := watchSlices(t, c, ns)

	loop := c.Traffic(t, cluster.TrafficOptions{Service: ns + "/shop", Port: 80, Duration: loopFor})
	logTimelineOnFailure(t, w, loop)
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)

	// The replacement starts: a new pod on the other node, published by that node's agent.
	replacing := time.Now()
	repl := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "shop-new", Node: "node-b", Labels: labels, ContainerPorts: webPorts})
	repl.ServeHTTP(t, 8080)
	kit.EventuallyEndpoints(t, c, ns, "shop", map[string]map[string]string{
		"shop-http-node-a": {ip(old): "TTF"},
		"shop-http-node-b": {ip(repl): "TTF"},
	})
	c.WaitProgrammed(t, ns+"/shop", 80, old, repl)
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)

	// The old pod is deleted gracefully and drains.
	terminating := time.Now()
	old.MarkTerminating(t)
	kit.EventuallyEndpoints(t, c, ns, "shop", map[string]map[string]string{
		"shop-http-node-a": {ip(old): "FTT"},
		"shop-http-node-b": {ip(repl): "TTF"},
	})
	c.WaitProgrammed(t, ns+"/shop", 80, repl)
	drained := time.Now()
	// It keeps passing its probes while it finishes: the agent still probes it (only probes
	// reach it now) and it stays serving.
	hits := oldServer.Hits()
	require.Eventually(t, func() bool { return oldServer.Hits() >= hits+3 }, waitFor, poll, "the agent keeps probing the terminating pod")
	kit.WaitRequestsAfter(t, loop, drained, minInWindow)
	got, err := e2e.EndpointsOf(t.Context(), c, ns, "shop")
	require.NoError(t, err)
	assert.Equal(t, "FTT", got["shop-http-node-a"][ip(old)], "the terminating pod still passes: not ready, serving, terminating")

	// Then it is gone: its server stops and its object is deleted.
	removing := time.Now()
	old.Delete(t)
	kit.EventuallyEndpoints(t, c, ns, "shop", map[string]map[string]string{"shop-http-node-b": {ip(repl): "TTF"}})
	removed := time.Now()
	kit.WaitRequestsAfter(t, loop, removed, minInWindow)
	res := loop.Stop()

	window := kit.RequireWindow(t, res, "the replacement, from the new pod to the old one removed", replacing, removed)
	kit.RequireWindow(t, res, "the drain, from the graceful delete to the removal", terminating, removing)
	assert.Empty(t, res.Failed(), "requests during the replacement: %s; failed: %s", res, e2e.Failures(res))
	assert.Positive(t, res.Before(terminating).ByPod()[old.Key()], "the old pod answered before it terminated: %s", res.Before(terminating))
	afterDrain := res.Since(drained)
	assert.Equal(t, map[string]int{repl.Key(): len(afterDrain)}, afterDrain.ByPod(), "once drained, only the new pod gets new connections")
	oldChanges := about(w.ConditionChangesBefore(removing), ip(old))
	assert.Equal(t, []string{"shop-http-node-a: " + ip(old) + " TTF -> FTT"}, oldChanges,
		"until its removal the old pod's only change is to terminating, still serving")
	t.Logf("scenario 4: %d requests during the replacement window (%s), %d failed; %d in the whole loop",
		len(window), removed.Sub(replacing).Round(time.Millisecond), len(window.Failed()), len(res))
	record(t, "4 graceful drain", res, window)
}

// about keeps the lines of ConditionChanges about the endpoint address.
func about(lines []string, address string) []string {
	var out []string
	for _, l := range lines {
		if strings.Contains(l, ": "+address+" ") {
			out = append(out, l)
		}
	}
	return out
}
