// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// What each dataplane does with an endpoint's (ready, serving, terminating) triple, read from
// its own programmed state and proven with requests: whether the endpoint gets new connections
// beside a ready one, whether it gets them when it is the only endpoint (the terminating
// fallback of KEP-1669), and that a connection opened while it was ready keeps working.
//
//   - kube-proxy (pkg/proxy/topology.go, CategorizeEndpoints): ready endpoints (terminating or
//     not), or the serving terminating ones when none is ready; anything else gets nothing.
//   - Cilium 1.20 (pkg/loadbalancer/reflectors/conversions.go and reconciler/bpf_reconciler.go):
//     ready -> active (terminating or not, "following kube-proxy"); terminating and serving -> terminating (used only when no backend is
//     active); terminating, not serving -> no slot; not ready, not terminating -> maintenance
//     (no slot: no new connection, established ones kept).
//
// Both dataplanes read every triple alike, so the test has one expectation per triple.
var conditionCases = map[string]struct {
	cond discoveryv1.EndpointConditions
	// besideReady: new connections while another endpoint is ready; alone: when it is the only one.
	besideReady, alone bool
}{
	"ready (TTF)":                            {cond: cond(true, true, false), besideReady: true, alone: true},
	"not ready, serving (FTF)":               {cond: cond(false, true, false)},
	"not ready, not serving (FFF)":           {cond: cond(false, false, false)},
	"terminating and serving (FTT)":          {cond: cond(false, true, true), alone: true},
	"terminating, not serving (FFT)":         {cond: cond(false, false, true)},
	"ready and terminating (TTT)":            {cond: cond(true, true, true), besideReady: true, alone: true},
	"no conditions (nil: ready per the API)": {cond: discoveryv1.EndpointConditions{}, besideReady: true, alone: true},
}

func cond(ready, serving, terminating bool) discoveryv1.EndpointConditions {
	return discoveryv1.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(serving), Terminating: ptr.To(terminating)}
}

// TestKubeProxyReadsEveryConditionTriple runs the triples through kube-proxy (nftables).
func TestKubeProxyReadsEveryConditionTriple(t *testing.T) {
	conditionTriples(t, cluster.Options{Nodes: twoZones, KubeProxy: true})
}

// TestCiliumReadsEveryConditionTriple runs the same triples through a real cilium-agent.
func TestCiliumReadsEveryConditionTriple(t *testing.T) {
	skipUnlessCilium(t)
	conditionTriples(t, cluster.Options{Nodes: twoZones, Cilium: true})
}

// skipUnlessCilium skips a Cilium test unless `make test-cilium` runs it (cluster.CiliumEnv).
func skipUnlessCilium(t *testing.T) {
	t.Helper()
	if !cluster.CiliumEnabled() {
		t.Skipf("the Cilium dataplane runs in `make test-cilium` (%s=1)", cluster.CiliumEnv)
	}
}

func conditionTriples(t *testing.T, opts cluster.Options) {
	c := cluster.Start(t, opts)
	for name, tc := range conditionCases {
		t.Run(name, func(t *testing.T) {
			ns := c.Env.CreateNamespaceForTest(t, "triple")
			const port, target = 7000, 7000
			a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "a", Node: "node-a"})
			b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "b", Node: "node-b"})
			aSrv := a.ServeTCP(t, target)
			b.ServeTCP(t, target)
			svc := createService(t, c, ns, "echo", port, target)
			writeSlice(t, c, ns, "echo", "echo-1", target, a.Endpoint(ready), b.Endpoint(ready))
			c.WaitProgrammed(t, svc, port, a, b)
			kept := dialUntil(t, c, svc, port, a.Key())

			// Beside a ready endpoint.
			subject := a.Endpoint(tc.cond)
			writeSlice(t, c, ns, "echo", "echo-1", target, subject, b.Endpoint(ready))
			want := []*cluster.Pod{b}
			if tc.besideReady {
				want = []*cluster.Pod{a, b}
			}
			c.WaitProgrammed(t, svc, port, want...)
			hits := aSrv.Hits()
			res := c.Requests(t, cluster.TrafficOptions{Service: svc, Port: port, Protocol: cluster.TCP, Count: 30})
			assert.Equal(t, 30, res.OK(), "%s", res)
			if tc.besideReady {
				assert.Equal(t, []string{a.Key(), b.Key()}, res.Pods(), "%s", res)
			} else {
				assert.Equal(t, []string{b.Key()}, res.Pods(), "%s", res)
				assert.Equal(t, hits, aSrv.Hits(), "the endpoint got new connections beside a ready one")
			}
			assertEchoes(t, kept, "established before the change")

			// Alone.
			writeSlice(t, c, ns, "echo", "echo-1", target, subject)
			want = nil
			if tc.alone {
				want = []*cluster.Pod{a}
			}
			c.WaitProgrammed(t, svc, port, want...)
			alone := c.Requests(t, cluster.TrafficOptions{Service: svc, Port: port, Protocol: cluster.TCP, Count: 10})
			if tc.alone {
				assert.Equal(t, map[string]int{a.Key(): 10}, alone.ByPod(), "%s", alone)
			} else {
				require.Len(t, alone.Failed(), 10, "no endpoint gets new connections: every request fails: %s", alone)
			}
			assertEchoes(t, kept, "established, still")
		})
	}
}
