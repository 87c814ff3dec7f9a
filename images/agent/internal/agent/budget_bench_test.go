// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// BenchmarkBudget (issue 28, part 5): one namespace asks one node for BUDGET_PODS pods ×
// BUDGET_RESOURCES resources × 32 probes (default 100 × 32 × 32 = 102,400 targets), a victim
// namespace for one (HTTP, every second). One agent with the default probe budget
// (agent.DefaultMaxProbeTargets, or BUDGET_MAX; "none" for no bound), the real prober, a real API server; the hog's
// in-budget targets are probed over TCP every BUDGET_PERIOD (default 10 s). Reported after the
// hog's resources are all reconciled: the victim's scheduling lag (start - due) over
// BUDGET_DURATION (default 30 s), the targets kept and over budget, and the process's memory:
// its peak RSS (VmHWM) and the Go heap in use after a collection. The test's own pod servers
// and API clients run in the same process, so both are upper bounds of the agent's.
func BenchmarkBudget(b *testing.B) {
	pods := envInt(b, "BUDGET_PODS", 100)
	resources := envInt(b, "BUDGET_RESOURCES", 32)
	budget := agent.DefaultMaxProbeTargets
	if os.Getenv("BUDGET_MAX") == "none" {
		budget = -1 // no bound: the anchor, the agent before the budget
	} else {
		budget = envInt(b, "BUDGET_MAX", budget)
	}
	hogPeriod := int32(envDuration(b, "BUDGET_PERIOD", 10*time.Second) / time.Second)
	window := envDuration(b, "BUDGET_DURATION", 30*time.Second)
	const probesPerResource = 32

	c, err := cluster.New(cluster.Options{Nodes: []cluster.Node{{Name: "node-a", Zone: "zone-a"}}})
	if errors.Is(err, cluster.ErrNotRoot) {
		b.Skipf("cluster: %v", err)
	}
	require.NoError(b, err)
	b.Cleanup(func() { assert.NoError(b, c.Stop()) })
	hog := c.Env.CreateNamespaceForTest(b, "hog")
	victim := c.Env.CreateNamespaceForTest(b, "victim")
	ports := []v1alpha1.ServicePort{namedPort("web", 80, intstr.FromInt32(8080))}

	hogLabels := map[string]string{"app": "hog"}
	c.AddBulkPods(b, cluster.BulkSpec{Namespace: hog, NamePrefix: "hog", Node: "node-a", Count: pods, Port: 8080,
		Labels: hogLabels, ContainerPorts: vmPorts})
	probes := make([]v1alpha1.Probe, probesPerResource)
	for i := range probes {
		probes[i] = tcpProbe(intstr.FromInt32(8080), 1, int32(1+i%10)) //nolint:gosec // i%10 fits
	}
	for r := range resources {
		createProbedResource(b, c, hog, fmt.Sprintf("hog-%03d", r), hogLabels, hogPeriod, ports, probes...)
	}
	victimLabels := map[string]string{"app": "victim"}
	vp := c.AddPod(b, cluster.PodSpec{Namespace: victim, Name: "victim-0", Node: "node-a", Labels: victimLabels, ContainerPorts: vmPorts})
	vp.ServeHTTP(b, 8080)
	createProbedResource(b, c, victim, "victim", victimLabels, 1, ports, httpProbe(intstr.FromInt32(8080), 1, 3))

	a, lags := runAgentMeasuringLag(b, c, victim, budget)

	asked := pods*resources*probesPerResource + 1
	start := time.Now()
	require.Eventually(b, func() bool { return a.Scheduler.Budget().Asked == asked }, 10*time.Minute, 100*time.Millisecond,
		"every target is asked for")
	settled := time.Since(start)
	require.Eventually(b, func() bool {
		got, err := slicesOf(b.Context(), c, victim, "victim")
		return err == nil && got["victim-web-node-a"].Endpoints[ip(vp)] == "TTF"
	}, 2*time.Minute, 100*time.Millisecond, "the victim's port is published serving")

	b.ResetTimer()
	for range b.N {
		lags.start()
		time.Sleep(window) // the measured window: the probes run meanwhile
		got := lags.stop()
		require.NotEmpty(b, got, "the victim's probe ran during the window")
		rep := a.Scheduler.Budget()
		runtime.GC()
		var ms0 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		b.ReportMetric(ms(percentile(got, 0.50)), "victim-lag-p50-ms")
		b.ReportMetric(ms(percentile(got, 0.99)), "victim-lag-p99-ms")
		b.ReportMetric(ms(percentile(got, 1)), "victim-lag-max-ms")
		b.ReportMetric(float64(len(got))/window.Seconds(), "victim-runs/s")
		b.ReportMetric(float64(rep.Asked), "targets-asked")
		b.ReportMetric(float64(rep.Admitted), "targets-probed")
		b.ReportMetric(testutil.ToFloat64(a.Metrics.TargetsOverBudget), "targets-over-budget")
		b.ReportMetric(float64(ms0.HeapInuse)/(1<<20), "heap-inuse-MiB")
		b.ReportMetric(peakRSSMiB(b), "peak-rss-MiB")
		b.ReportMetric(settled.Seconds(), "asked-after-s")
	}
}

// peakRSSMiB is the process's peak resident set (VmHWM), in MiB.
func peakRSSMiB(b *testing.B) float64 {
	b.Helper()
	raw, err := os.ReadFile("/proc/self/status")
	require.NoError(b, err)
	for l := range strings.SplitSeq(string(raw), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			require.NoError(b, err)
			return kb / 1024
		}
	}
	b.Fatal("no VmHWM in /proc/self/status")
	return 0
}
