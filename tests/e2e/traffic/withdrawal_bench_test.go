// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// BenchmarkDeadNodeWithdrawal measures the controller's withdrawal of a dead node on the shared
// stack (real agents, controllers and kube-proxy; agent-lost grace 6 s, Leases renewed every
// second): each iteration stops node-b's agent and measures, from the last renewal of its Lease
// (the instant the grace counts from),
//
//   - withdrawn: until a watch of the namespace's slices sees node-b's pod ready=false,
//     serving=false (the grace plus the controller's observation period and its write);
//   - routed: until kube-proxy's rules send the Service's new connections to node-a's pod only
//     (polled every testkit/cluster poll interval, so up to one poll late).
//
// then starts the agent again and waits until both pods are routed. It reports p50 and p99 in
// ms over the iterations (ns/op is the whole iteration, restart included). Run alone on a quiet
// machine (development/BENCHMARKS.md):
//
//	cd tests && go test ./e2e/traffic/ -run '^$' -bench DeadNodeWithdrawal -benchtime 10x
func BenchmarkDeadNodeWithdrawal(b *testing.B) {
	s := testStack(b)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(b, "withdrawbench")
	labels := map[string]string{"app": "web"}
	pa := c.AddPod(b, cluster.PodSpec{Namespace: ns, Name: "web-a", Node: "node-a", Labels: labels, ContainerPorts: webPorts})
	pb := c.AddPod(b, cluster.PodSpec{Namespace: ns, Name: "web-b", Node: "node-b", Labels: labels, ContainerPorts: webPorts})
	pa.ServeHTTP(b, 8080)
	pb.ServeHTTP(b, 8080)
	createResource(b, c, kit.Resource(ns, "web", labels,
		[]v1alpha1.ServicePort{e2e.ServicePort("http", 80, intstr.FromInt32(8080))},
		kit.HTTPProbe(intstr.FromInt32(8080))))
	both := map[string]map[string]string{"web-http-node-a": {ip(pa): "TTF"}, "web-http-node-b": {ip(pb): "TTF"}}
	withdrawn := map[string]map[string]string{"web-http-node-a": {ip(pa): "TTF"}, "web-http-node-b": {ip(pb): "FFF"}}
	kit.EventuallyEndpoints(b, c, ns, "web", both)
	c.WaitProgrammed(b, ns+"/web", 80, pa, pb)
	w := watchSlices(b, c, ns)
	b.Cleanup(func() { _ = s.StartAgent(b.Context(), "node-b") }) // a no-op when it runs

	var decided, routed []time.Duration
	for b.Loop() {
		stopped := time.Now()
		if err := s.StopAgent(b.Context(), "node-b"); err != nil {
			b.Fatal(err)
		}
		kit.EventuallyEndpoints(b, c, ns, "web", withdrawn)
		c.WaitProgrammed(b, ns+"/web", 80, pa)
		routedAt := time.Now()
		last, err := lastRenewal(b, s, "node-b")
		if err != nil {
			b.Fatal(err)
		}
		seen := firstChangeTo(w, stopped, "web-http-node-b", ip(pb), "FFF")
		if seen.IsZero() {
			b.Fatal("the watch did not see node-b's pod withdrawn")
		}
		decided = append(decided, seen.Sub(last))
		routed = append(routed, routedAt.Sub(last))
		if err := s.StartAgent(b.Context(), "node-b"); err != nil {
			b.Fatal(err)
		}
		kit.EventuallyEndpoints(b, c, ns, "web", both)
		c.WaitProgrammed(b, ns+"/web", 80, pa, pb)
	}
	grace := s.Options().AgentLostGrace
	for _, d := range decided {
		if d < grace {
			b.Errorf("withdrawn %s after the last renewal, before the grace %s", d, grace)
		}
	}
	b.ReportMetric(ms(quantile(decided, 0.5)), "withdrawn-p50-ms")
	b.ReportMetric(ms(quantile(decided, 0.99)), "withdrawn-p99-ms")
	b.ReportMetric(ms(quantile(routed, 0.5)), "routed-p50-ms")
	b.ReportMetric(ms(quantile(routed, 0.99)), "routed-p99-ms")
	b.ReportMetric(ms(grace), "grace-ms")
	b.Logf("last renewal → withdrawn: %v; → routed: %v (grace %v, dataplane %s)", decided, routed, grace, c.Dataplane())
}

// lastRenewal reads the renewTime of the node's agent Lease.
func lastRenewal(tb testing.TB, s *stack.Stack, node string) (time.Time, error) {
	var l coordinationv1.Lease
	key := client.ObjectKey{Namespace: stack.Namespace, Name: wellknown.AgentLeaseName(node)}
	if err := s.Cluster.Env.Client.Get(tb.Context(), key, &l); err != nil {
		return time.Time{}, err
	}
	if l.Spec.RenewTime == nil {
		return time.Time{}, fmt.Errorf("lease %s has no renewTime", key)
	}
	return l.Spec.RenewTime.Time, nil
}

// quantile is the nearest-rank q-quantile of ds (0 for none).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
