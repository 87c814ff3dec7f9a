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

// Scenario 5: an agent restart, a controller leader change and a rolling replacement of every
// agent, one after the other during one steady request loop, fail no request and change no
// endpoint's conditions: a watch opened before the first event sees none (neither the ready
// pods nor the one whose probe fails flip). The events did happen: new PIDs, a new leader
// holding the election Lease, new agents that probed again, and each window spans a full
// agent-lost grace, the time after which a missed renewal would have withdrawn a node.
//
// The same scenario runs on Cilium (TestCiliumRestartsAndALeaderChangeChangeNothingForTraffic).
func TestRestartsAndALeaderChangeChangeNothingForTraffic(t *testing.T) {
	restartsChangeNothingForTraffic(t, testStack(t))
}

// restartsChangeNothingForTraffic is scenario 5 on the stack's dataplane.
func restartsChangeNothingForTraffic(t *testing.T, s *stack.Stack) {
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "restarts")
	labels := map[string]string{"app": "web"}
	a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-a", Node: "node-a", Labels: labels, ContainerPorts: webPorts})
	b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-b", Node: "node-b", Labels: labels, ContainerPorts: webPorts})
	// A pod whose server never answers: its endpoint must stay not ready across the restarts.
	down := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-down", Node: "node-a", Labels: labels, ContainerPorts: webPorts})
	a.ServeHTTP(t, 8080)
	serverB := b.ServeHTTP(t, 8080)
	createResource(t, c, kit.Resource(ns, "web", labels,
		[]v1alpha1.ServicePort{e2e.ServicePort("http", 80, intstr.FromInt32(8080))},
		kit.HTTPProbe(intstr.FromInt32(8080))))
	want := map[string]map[string]string{
		"web-http-node-a": {ip(a): "TTF", ip(down): "FFF"},
		"web-http-node-b": {ip(b): "TTF"},
	}
	kit.EventuallyEndpoints(t, c, ns, "web", want)
	c.WaitProgrammed(t, ns+"/web", 80, a, b)
	// Probe targets per node, to tell when a new agent has probed each of its targets again.
	targets := map[string]int{"node-a": 2, "node-b": 1}
	grace := s.Options().AgentLostGrace

	w := watchSlices(t, c, ns)
	loop := c.Traffic(t, cluster.TrafficOptions{Service: ns + "/web", Port: 80, Duration: loopFor})
	logTimelineOnFailure(t, w, loop)
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)

	type window struct {
		name     string
		from, to time.Time
	}
	var windows []window

	// 1. The agent of node-a restarts.
	from := time.Now()
	kit.RestartAgent(t, s, "node-a", targets["node-a"])
	to := time.Now().Add(grace)
	kit.WaitRequestsAfter(t, loop, to, minInWindow)
	windows = append(windows, window{"agent restart", from, to})

	// 2. The controller leader changes.
	from = time.Now()
	kit.ChangeLeader(t, s)
	to = time.Now().Add(grace)
	kit.WaitRequestsAfter(t, loop, to, minInWindow)
	windows = append(windows, window{"leader change", from, to})

	// 3. Every agent is replaced, one node at a time.
	from = time.Now()
	pids := map[string]int{}
	for _, n := range s.Nodes() {
		pids[n] = s.AgentPID(n)
	}
	require.NoError(t, s.RollAgents(t.Context()))
	for _, n := range s.Nodes() {
		assert.NotEqual(t, pids[n], s.AgentPID(n), "the agent of %s is a new process", n)
		kit.RequireProbedAgain(t, s, n, targets[n])
	}
	to = time.Now().Add(grace)
	kit.WaitRequestsAfter(t, loop, to, minInWindow)
	windows = append(windows, window{"rolling replacement of every agent", from, to})
	res := loop.Stop()

	assert.Empty(t, res.Failed(), "requests across the restarts: %s; failed: %s", res, e2e.Failures(res))
	for _, win := range windows {
		in := kit.RequireWindow(t, res, win.name, win.from, win.to)
		assert.Empty(t, in.Failed(), "%s: %s", win.name, in)
		assert.ElementsMatch(t, []string{a.Key(), b.Key()}, in.Pods(), "%s: both ready pods answered", win.name)
		t.Logf("scenario 5, %s: %d requests in %s, %d failed", win.name, len(in), win.to.Sub(win.from).Round(time.Millisecond), len(in.Failed()))
	}
	assert.Equal(t, want, w.Initial(), "the watch started from the published state")
	assert.Empty(t, w.ConditionChanges(), "no endpoint condition changed across the restarts")
	all := between(res, windows[0].from, windows[len(windows)-1].to)
	record(t, "5 agent restart, leader change, agent roll", res, all)

	// The watch does see a change when there is one.
	serverB.Stop()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.Contains(ct, w.ConditionChanges(), "web-http-node-b: "+ip(b)+" TTF -> FFF")
	}, waitFor, poll, "the watch records a real readiness change")
}
