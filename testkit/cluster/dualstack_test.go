// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// writeSliceOf creates the EndpointSlice name of the Service with one endpoint per pod: the
// pod's address of the slice's family, on port "main" = targetPort.
func writeSliceOf(t testing.TB, c *cluster.Cluster, ns, service, name string, family corev1.IPFamily, targetPort int32, pods ...*cluster.Pod) {
	t.Helper()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: service,
			discoveryv1.LabelManagedBy:   testManagedBy,
		}},
		AddressType: discoveryv1.AddressType(family),
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("main"), Port: ptr.To(targetPort), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for _, p := range pods {
		a, ok := p.IPOf(family)
		require.True(t, ok, "pod %s has a %s address", p.Key(), family)
		ep := p.Endpoint(ready)
		ep.Addresses = []string{a.String()}
		slice.Endpoints = append(slice.Endpoints, ep)
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), slice))
}

// A dual-stack cluster: nodes with an InternalIP of each family, pods with an address of each
// family (or of one), a RequireDualStack Service with a ClusterIP of each family, and kube-proxy
// routing each ClusterIP from the slices of its family to the pods' addresses of that family.
func TestADualStackClusterRoutesBothFamilies(t *testing.T) {
	dualStackClusterRoutesBothFamilies(t, cluster.Options{Nodes: twoZones, KubeProxy: true, DualStack: true})
}

// TestCiliumADualStackClusterRoutesBothFamilies is the same through a dual-stack cilium-agent
// (IPv4 and IPv6 socket load balancing, native routing of both families).
func TestCiliumADualStackClusterRoutesBothFamilies(t *testing.T) {
	skipUnlessCilium(t)
	dualStackClusterRoutesBothFamilies(t, cluster.Options{Nodes: twoZones, Cilium: true, DualStack: true})
}

func dualStackClusterRoutesBothFamilies(t *testing.T, opts cluster.Options) {
	c := cluster.Start(t, opts)
	require.True(t, c.DualStack())
	ns := c.Env.CreateNamespaceForTest(t, "dual")

	for _, n := range c.Nodes {
		require.True(t, n.IP6.IsValid(), "node %s has an IPv6 address", n.Name)
		assert.True(t, netip.MustParsePrefix(cluster.NodeCIDR6).Contains(n.IP6))
		node := &corev1.Node{}
		require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKey{Name: n.Name}, node))
		var internal []string
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = append(internal, a.Address)
			}
		}
		assert.Equal(t, []string{n.IP.String(), n.IP6.String()}, internal, "node %s reports both InternalIPs, IPv4 first", n.Name)
	}

	dual := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "dual", Node: "node-a"})
	v6only := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "v6only", Node: "node-b", IPFamilies: []corev1.IPFamily{corev1.IPv6Protocol}})
	v4only := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "v4only", Node: "node-b", IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}})
	for _, p := range []*cluster.Pod{dual, v6only, v4only} {
		p.ServeHTTP(t, 8080)
	}
	require.Len(t, dual.IPs, 2)
	assert.True(t, dual.IP.Is4(), "IPv4 is the primary family")
	assert.True(t, netip.MustParsePrefix(cluster.PodCIDR6).Contains(dual.IPs[1]))
	assert.True(t, v6only.IP.Is6())
	assert.Len(t, v6only.IPs, 1)
	obj, err := dual.Object(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []corev1.PodIP{{IP: dual.IPs[0].String()}, {IP: dual.IPs[1].String()}}, obj.Status.PodIPs)
	assert.Len(t, obj.Status.HostIPs, 2, "a pod's hostIPs are its node's InternalIPs")

	// An IPv4-only cluster (here one on the same control plane) makes no IPv6 pod.
	v4cluster := cluster.Start(t, cluster.Options{Env: c.Env, Nodes: []cluster.Node{{Name: "node-v4"}}})
	assert.False(t, v4cluster.DualStack())
	_, err = v4cluster.NewPod(t.Context(), cluster.PodSpec{Namespace: ns, Name: "nope", IPFamilies: []corev1.IPFamily{corev1.IPv6Protocol}})
	require.ErrorContains(t, err, "needs a dual-stack cluster")

	policy := corev1.IPFamilyPolicyRequireDualStack
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: corev1.ServiceSpec{
			IPFamilyPolicy: &policy,
			Ports:          []corev1.ServicePort{{Name: "main", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), svc))
	require.Equal(t, []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}, svc.Spec.IPFamilies)
	v4IP, err := c.ClusterIPOf(t.Context(), ns+"/web", corev1.IPv4Protocol)
	require.NoError(t, err)
	v6IP, err := c.ClusterIPOf(t.Context(), ns+"/web", corev1.IPv6Protocol)
	require.NoError(t, err)
	assert.True(t, netip.MustParsePrefix(cluster.ServiceCIDR6).Contains(netip.MustParseAddr(v6IP)))

	writeSliceOf(t, c, ns, "web", "web-v4", corev1.IPv4Protocol, 8080, dual, v4only)
	writeSliceOf(t, c, ns, "web", "web-v6", corev1.IPv6Protocol, 8080, dual, v6only)
	c.WaitProgrammedOf(t, ns+"/web", 80, corev1.IPv4Protocol, dual, v4only)
	c.WaitProgrammedOf(t, ns+"/web", 80, corev1.IPv6Protocol, dual, v6only)
	c.WaitProgrammed(t, ns+"/web", 80, dual, v4only) // the IPv4 view of the same rules

	for family, want := range map[string][]string{
		v4IP: {dual.Key(), v4only.Key()},
		v6IP: {dual.Key(), v6only.Key()},
	} {
		res := c.Requests(t, cluster.TrafficOptions{Address: family, Port: 80, Count: 60})
		assert.Empty(t, res.Failed(), "through %s: %s", family, res)
		assert.Equal(t, want, res.Pods(), "through %s: both endpoints of the family answer", family)
	}

	// A pod's IPv6 address is usable at once: it is never tentative (no duplicate address
	// detection to wait for), and the first request reaches the pod.
	fresh := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "fresh", Node: "node-a", IPFamilies: []corev1.IPFamily{corev1.IPv6Protocol}})
	out, err := fresh.Command("ip", "-6", "addr", "show", "dev", "eth0").CombinedOutput()
	require.NoError(t, err, "%s", out)
	var line string
	for l := range strings.Lines(string(out)) {
		if strings.Contains(l, " "+fresh.IP.String()+"/") {
			line = l
		}
	}
	assert.Contains(t, line, "nodad", "the pod's address: %s", out)
	assert.NotContains(t, line, "tentative", "the pod's address is not waiting for duplicate address detection: %s", out)
	fresh.ServeHTTP(t, 8080)
	res := c.Requests(t, cluster.TrafficOptions{Address: fresh.IP.String(), Port: 8080, Count: 1})
	assert.Equal(t, []string{fresh.Key()}, res.Pods(), "%s", res)
}
