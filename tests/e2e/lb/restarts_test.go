// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package lb_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// An agent restart and a controller leader change never fail a node's health check: with both
// pods healthy, node-a's agent restarts, then the controller leader changes, each window lasting
// until one full agent-lost grace after the event settled (when a missed renewal or a new
// leader's misjudgement would have withdrawn node-a's endpoints). Asserted: every health check
// of node-a and node-b in the windows answered 200 with localEndpoints 1, the load balancer's
// view of either node never changed after it first saw them healthy (no flap), and a loop
// through the load balancer lost nothing with both pods answering in each window. The events
// did happen (a new agent process that probed again, a new leader in the election Lease that
// reconciles), and the same checks do see a real failure afterwards.
func TestAnAgentRestartAndALeaderChangeNeverFailANodesHealthCheck(t *testing.T) {
	s := shared.Get(t)
	sc := newScene(t, s, "restarts")
	grace := s.Options().AgentLostGrace
	loop := sc.lb.Traffic(t, cluster.TrafficOptions{Duration: loopFor})
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)

	type window struct {
		name     string
		from, to time.Time
	}
	var windows []window

	// 1. The agent of node-a restarts.
	from := time.Now()
	kit.RestartAgent(t, s, "node-a", 1)
	to := time.Now().Add(grace)
	kit.WaitRequestsAfter(t, loop, to, minInWindow)
	waitChecksAfter(t, sc.lb, "node-a", to, 1)
	windows = append(windows, window{"agent restart on node-a", from, to})

	// 2. The controller leader changes.
	from = time.Now()
	kit.ChangeLeader(t, s)
	to = time.Now().Add(grace)
	kit.WaitRequestsAfter(t, loop, to, minInWindow)
	waitChecksAfter(t, sc.lb, "node-a", to, 1)
	windows = append(windows, window{"controller leader change", from, to})
	res := loop.Stop()

	checks, failedChecks := map[string]int{}, map[string]int{}
	for _, w := range windows {
		for _, n := range []string{"node-a", "node-b"} {
			in := requireAllPass(t, sc.lb, n, w.from, w.to, w.name)
			checks[n] += len(in)
			failedChecks[n] += len(in.NotOK())
		}
		in := kit.RequireWindow(t, res, w.name, w.from, w.to)
		assert.Empty(t, in.Failed(), "%s: %s", w.name, in)
		assert.ElementsMatch(t, []string{sc.a.Key(), sc.b.Key()}, in.Pods(), "%s: the load balancer sent to both nodes", w.name)
		t.Logf("%s: %d requests in %s, %d failed; node-a passed %d checks", w.name, len(in), w.to.Sub(w.from).Round(time.Millisecond),
			len(in.Failed()), len(sc.lb.Checks("node-a").Since(w.from).Before(w.to)))
	}
	assert.Empty(t, res.Failed(), "requests through the load balancer: %s; failed: %s", res, e2e.Failures(res))
	for _, n := range []string{"node-a", "node-b"} {
		assert.Len(t, sc.lb.Changes(n), 1, "the load balancer's view of %s changed only once, to healthy: %v", n, sc.lb.Changes(n))
	}
	all := res.Since(windows[0].from).Before(windows[len(windows)-1].to)
	figures(t, "agent restart, leader change", "node_a_checks", checks["node-a"], "node_a_failed_checks", failedChecks["node-a"],
		"node_b_checks", checks["node-b"], "node_b_failed_checks", failedChecks["node-b"], "requests", len(all), "failed", len(all.Failed()))

	// The same checks see a real failure: node-a's pod stops.
	stopping := time.Now()
	sc.srvA.Stop()
	require.Eventually(t, func() bool { _, ok := sc.lb.Checks("node-a").Since(stopping).FirstNotOK(); return ok }, waitFor, poll,
		"node-a fails its health check once its pod stops")
}
