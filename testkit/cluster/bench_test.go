// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster_test

import (
	"strconv"
	"testing"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// BenchmarkPodLifecycle measures one pod: network namespace, veth pair, addresses and routes,
// Pod object and status, then deletion of the object and removal of the namespace.
func BenchmarkPodLifecycle(b *testing.B) {
	c := cluster.Start(b, cluster.Options{})
	ns := c.Env.CreateNamespaceForTest(b, "bench")
	i := 0
	for b.Loop() {
		i++
		p, err := c.NewPod(b.Context(), cluster.PodSpec{Namespace: ns, Name: "p-" + strconv.Itoa(i)})
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Remove(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSliceChangeToKubeProxyRules measures the time from writing an EndpointSlice change
// to kube-proxy's nftables rules sending new connections accordingly (minSyncPeriod 100 ms).
func BenchmarkSliceChangeToKubeProxyRules(b *testing.B) {
	c := cluster.Start(b, cluster.Options{KubeProxy: true})
	ns := c.Env.CreateNamespaceForTest(b, "bench")
	pa := c.AddPod(b, cluster.PodSpec{Namespace: ns, Name: "a"})
	pb := c.AddPod(b, cluster.PodSpec{Namespace: ns, Name: "b"})
	svc := createService(b, c, ns, "web", 80, 8080)
	writeSlice(b, c, ns, "web", "web-1", 8080, pa.Endpoint(ready), pb.Endpoint(ready))
	c.WaitProgrammed(b, svc, 80, pa, pb)
	withB := false
	for b.Loop() {
		if withB {
			writeSlice(b, c, ns, "web", "web-1", 8080, pa.Endpoint(ready), pb.Endpoint(ready))
			c.WaitProgrammed(b, svc, 80, pa, pb)
		} else {
			writeSlice(b, c, ns, "web", "web-1", 8080, pa.Endpoint(ready), pb.Endpoint(notReady))
			c.WaitProgrammed(b, svc, 80, pa)
		}
		withB = !withB
	}
}
