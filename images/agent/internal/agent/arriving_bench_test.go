// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// BenchmarkArrivingNamespace measures the first verdict of a namespace that arrives while
// another holds every worker it may (TestAnArrivingNamespaceIsServedWhileAnotherHoldsEveryWorker,
// repeated): namespace hog holds 7 of the agent's 8 workers with HTTP probes that hang for the
// CRD's largest timeout (300 s); each iteration a new namespace's pod and resource (period 1 s,
// timeout 1 s, one success) are created and the time from the resource's creation until the
// slice publishes the pod ready is measured (polled every 10 ms); the resource is then deleted,
// so that every arrival finds the same node. It reports p50 and p99 in ms; ns/op is the whole
// iteration. Run alone on a quiet machine (development/BENCHMARKS.md):
//
//	cd images/agent/internal/agent && go test . -run '^$' -bench ArrivingNamespace -benchtime 20x
func BenchmarkArrivingNamespace(b *testing.B) {
	c := testCluster(b)
	hog := c.Env.CreateNamespaceForTest(b, "hog")
	ports := []v1alpha1.ServicePort{namedPort("web", 80, intstr.FromInt32(8080))}
	const workers, reserve = 8, 1
	hogLabels := map[string]string{"app": "hog"}
	hp := c.AddPod(b, cluster.PodSpec{Namespace: hog, Name: "hog-0", Node: "node-a", Labels: hogLabels, ContainerPorts: vmPorts})
	h := serveHanging(b, hp, 8080)
	probes := hangingProbes(2 * workers)
	for i := range probes {
		probes[i].TimeoutSeconds = maxTimeoutSeconds
	}
	createProbedResource(b, c, hog, "hog", hogLabels, maxTimeoutSeconds, ports, probes...)
	a := startAgent(b, c, "node-a", func(o *agent.Options) { o.ProbeConcurrency = workers })
	hogs := []*hangingServer{h}
	require.Eventually(b, func() bool {
		_, waiting := a.Scheduler.InFlight()
		return held(hogs) >= workers-reserve && waiting > 0
	}, time.Minute, 50*time.Millisecond, "the hog's probes hold every worker it may, and more wait")

	arrive := c.Env.CreateNamespaceForTest(b, "arrive")
	var firsts []time.Duration
	i := 0
	for b.Loop() {
		labels := map[string]string{"app": fmt.Sprintf("web-%d", i)}
		web := c.AddPod(b, cluster.PodSpec{Namespace: arrive, Name: fmt.Sprintf("web-%d", i), Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
		web.ServeHTTP(b, 8080)
		name := fmt.Sprintf("web-%d", i)
		start := time.Now()
		swh := createProbedResource(b, c, arrive, name, labels, 1, ports, httpProbe(intstr.FromInt32(8080), 1, 3))
		slice := name + "-web-node-a"
		require.Eventually(b, func() bool {
			got, err := slicesOf(b.Context(), c, arrive, name)
			return err == nil && got[slice].Endpoints[ip(web)] == "TTF"
		}, time.Minute, 10*time.Millisecond, "the arriving resource %s is published", name)
		firsts = append(firsts, time.Since(start))
		require.NoError(b, c.Env.Client.Delete(b.Context(), swh))
		i++
	}
	require.GreaterOrEqual(b, held(hogs), int64(workers-reserve), "the hog's probes still hold their workers")
	b.ReportMetric(ms(percentile(firsts, 0.50)), "first-verdict-p50-ms")
	b.ReportMetric(ms(percentile(firsts, 0.99)), "first-verdict-p99-ms")
	b.Logf("resource created → published: %v", firsts)
}
