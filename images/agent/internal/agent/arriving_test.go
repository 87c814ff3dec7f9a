// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// maxTimeoutSeconds is the largest timeoutSeconds the CRD allows (the Maximum marker of
// Probe.TimeoutSeconds in api/v1alpha1); periodSeconds may not be below it.
const maxTimeoutSeconds = 300

// Issue 28, part 4: a namespace that arrives is served at once. Namespace hog is alone on the
// node and holds every worker it may (8 workers, one of them reserved for namespaces with no
// run in flight) with HTTP probes at the largest timeout the CRD allows against a server that
// accepts and never answers. Then namespace arrive's first pod appears: its port is published
// while every one of hog's probes still hangs, far before the first of them could time out.
// Before the reserve, hog held all 8 workers and arrive's first probe waited for hog's 300 s
// timeout.
func TestAnArrivingNamespaceIsServedWhileAnotherHoldsEveryWorker(t *testing.T) {
	c := testCluster(t)
	hog := c.Env.CreateNamespaceForTest(t, "hog")
	arrive := c.Env.CreateNamespaceForTest(t, "arrive")
	ports := []v1alpha1.ServicePort{namedPort("web", 80, intstr.FromInt32(8080))}
	const workers, reserve = 8, 1 // reserve: the scheduler's reserveFor(8)
	hogLabels := map[string]string{"app": "hog"}
	hp := c.AddPod(t, cluster.PodSpec{Namespace: hog, Name: "hog-0", Node: "node-a", Labels: hogLabels, ContainerPorts: vmPorts})
	h := serveHanging(t, hp, 8080)
	probes := hangingProbes(2 * workers)
	for i := range probes {
		probes[i].TimeoutSeconds = maxTimeoutSeconds
	}
	createProbedResource(t, c, hog, "hog", hogLabels, maxTimeoutSeconds, ports, probes...)
	a := startAgent(t, c, "node-a", func(o *agent.Options) { o.ProbeConcurrency = workers })
	hogs := []*hangingServer{h}
	// The hog holds every worker it may when its next due run waits for one.
	require.Eventually(t, func() bool {
		_, waiting := a.Scheduler.InFlight()
		return held(hogs) >= workers-reserve && waiting > 0
	}, time.Minute, 50*time.Millisecond, "the hog's probes hold every worker it may, and more wait")
	running, _ := a.Scheduler.InFlight()
	t.Logf("the hog holds %d of %d workers", running, workers)

	// The arriving namespace: periodSeconds 1, timeoutSeconds 1, published after one pass.
	labels := map[string]string{"app": "web"}
	web := c.AddPod(t, cluster.PodSpec{Namespace: arrive, Name: "web-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	web.ServeHTTP(t, 8080)
	start := time.Now()
	createResource(t, c, arrive, "web", labels, ports, httpProbe(intstr.FromInt32(8080), 1, 3))
	// A generous deadline for the API server and the test's own polling, and still far below
	// the hog's 300 s timeout, which the arriving probe waited for before the reserve.
	const deadline = 60 * time.Second
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		got, err := slicesOf(t.Context(), c, arrive, "web")
		require.NoError(ct, err)
		assert.Equal(ct, "TTF", got["web-web-node-a"].Endpoints[ip(web)])
	}, deadline, 50*time.Millisecond, "the arriving namespace's port is published while the hog holds its workers")
	t.Logf("the arriving namespace's port was published %s after its resource was created", time.Since(start))

	// Every probe of the hog that started is still in flight: none ended, none timed out, and
	// they still hold every worker but the reserve.
	assert.Equal(t, h.accepted.Load(), h.open.Load(), "none of the hog's probes has ended")
	assert.GreaterOrEqual(t, held(hogs), int64(workers-reserve), "the hog's probes still hold their workers")
	running, _ = a.Scheduler.InFlight()
	assert.GreaterOrEqual(t, running, workers-reserve, "runs in flight")
}
