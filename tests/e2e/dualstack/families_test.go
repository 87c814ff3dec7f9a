// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package dualstack_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// A RequireDualStack resource over dual-stack pods gets a Service with a ClusterIP of each
// family and one slice per family on each node, and is reached over both: loops through the
// IPv4 and the IPv6 ClusterIP reach both pods with zero failures. The status counts the pods,
// once each, whatever the number of their addresses.
func TestARequireDualStackResourceIsReachedOverIPv4AndIPv6(t *testing.T) {
	s := shared.Get(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "dual")
	labels := map[string]string{"app": "web"}
	a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-a", Node: "node-a", Labels: labels, ContainerPorts: webPorts})
	b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-b", Node: "node-b", Labels: labels, ContainerPorts: webPorts})
	a.ServeHTTP(t, 8080)
	b.ServeHTTP(t, 8080)
	createResource(t, c, requireDualStack(kit.Resource(ns, "web", labels,
		[]v1alpha1.ServicePort{e2e.ServicePort("http", 80, intstr.FromString("http"))}, kit.HTTPProbe(intstr.FromInt32(8080)))), both)
	eventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-a":       {addr(t, a, v4): "TTF"},
		"web-http--node-a-ipv6": {addr(t, a, v6): "TTF"},
		"web-http-node-b":       {addr(t, b, v4): "TTF"},
		"web-http--node-b-ipv6": {addr(t, b, v6): "TTF"},
	})
	c.WaitProgrammedOf(t, ns+"/web", 80, v4, a, b)
	c.WaitProgrammedOf(t, ns+"/web", 80, v6, a, b)
	eventuallyStatus(t, c, ns, "web", "http 2/2", metav1.ConditionTrue, "every port has a ready endpoint")

	l := startLoops(t, c, ns+"/web", 80, cluster.HTTP, both)
	l.waitAfter(t, time.Now())
	start := time.Now()
	l.waitAfter(t, start)
	end := time.Now()
	l.waitAfter(t, end)
	res := l.stop()
	requireNoFailure(t, "RequireDualStack over both families", res, start, end,
		map[corev1.IPFamily][]string{v4: keys(a, b), v6: keys(a, b)})
}

// A probe failing on one port withdraws the pod from that port in both families' slices and
// from nothing else: the pod is probed once per port (at its primary address, as the kubelet
// probes a pod), and the verdict holds for every address of the pod. Web traffic through both
// ClusterIPs goes on with zero failures while the SMTP server of one pod is down, and SMTP
// through both ClusterIPs reaches the other pod only, with zero failures once it is withdrawn.
//
// The same scenario runs on Cilium (TestCiliumAFailingPortWithdrawsThePodFromThatPortInBothFamilies).
func TestAFailingPortWithdrawsThePodFromThatPortInBothFamilies(t *testing.T) {
	failingPortWithdrawsThePodInBothFamilies(t, shared.Get(t))
}

// failingPortWithdrawsThePodInBothFamilies is the failing-port scenario on the stack's dataplane.
func failingPortWithdrawsThePodInBothFamilies(t *testing.T, s *stack.Stack) {
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "vm")
	labels := map[string]string{"vm": "mail"}
	vm0 := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "vm-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	vm1 := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "vm-1", Node: "node-b", Labels: labels, ContainerPorts: vmPorts})
	vm0.ServeHTTP(t, 8080)
	vm1.ServeHTTP(t, 8080)
	smtp0 := vm0.ServeSMTP(t, 2525)
	vm1.ServeSMTP(t, 2525)
	createResource(t, c, requireDualStack(kit.Resource(ns, "mail", labels,
		[]v1alpha1.ServicePort{e2e.ServicePort("web", 80, intstr.FromString("web")), e2e.ServicePort("smtp", 25, intstr.FromInt32(2525))},
		kit.HTTPProbe(intstr.FromInt32(8080)), kit.TCPProbe(intstr.FromString("smtp")))), both)
	healthy := map[string]map[string]string{
		"mail-web-node-a":        {addr(t, vm0, v4): "TTF"},
		"mail-web--node-a-ipv6":  {addr(t, vm0, v6): "TTF"},
		"mail-web-node-b":        {addr(t, vm1, v4): "TTF"},
		"mail-web--node-b-ipv6":  {addr(t, vm1, v6): "TTF"},
		"mail-smtp-node-a":       {addr(t, vm0, v4): "TTF"},
		"mail-smtp--node-a-ipv6": {addr(t, vm0, v6): "TTF"},
		"mail-smtp-node-b":       {addr(t, vm1, v4): "TTF"},
		"mail-smtp--node-b-ipv6": {addr(t, vm1, v6): "TTF"},
	}
	before := eventuallyEndpoints(t, c, ns, "mail", healthy)
	for _, f := range both {
		c.WaitProgrammedOf(t, ns+"/mail", 80, f, vm0, vm1)
		c.WaitProgrammedOf(t, ns+"/mail", 25, f, vm0, vm1)
	}

	web := startLoops(t, c, ns+"/mail", 80, cluster.HTTP, both)
	web.waitAfter(t, time.Now())
	stopped := time.Now()
	smtp0.Stop()
	withdrawn := map[string]map[string]string{}
	for name, eps := range healthy {
		withdrawn[name] = eps
	}
	withdrawn["mail-smtp-node-a"] = map[string]string{addr(t, vm0, v4): "FFF"}
	withdrawn["mail-smtp--node-a-ipv6"] = map[string]string{addr(t, vm0, v6): "FFF"}
	during := eventuallyEndpoints(t, c, ns, "mail", withdrawn)
	for _, f := range both {
		c.WaitProgrammedOf(t, ns+"/mail", 25, f, vm1)
	}
	eventuallyStatus(t, c, ns, "mail", "web 2/2, smtp 1/2", metav1.ConditionTrue, "every port has a ready endpoint")
	smtp := startLoops(t, c, ns+"/mail", 25, cluster.SMTP, both)
	smtp.waitAfter(t, time.Now())
	smtpFrom := time.Now()
	smtp.waitAfter(t, smtpFrom)
	smtpTo := time.Now()
	smtp.waitAfter(t, smtpTo)
	requireNoFailure(t, "SMTP of the other pod while one pod's SMTP is withdrawn", smtp.stop(), smtpFrom, smtpTo,
		map[corev1.IPFamily][]string{v4: keys(vm1), v6: keys(vm1)})

	require.NoError(t, smtp0.Start())
	eventuallyEndpoints(t, c, ns, "mail", healthy)
	for _, f := range both {
		c.WaitProgrammedOf(t, ns+"/mail", 25, f, vm0, vm1)
	}
	back := time.Now()
	web.waitAfter(t, back)
	requireNoFailure(t, "web of both pods while one pod's SMTP fails", web.stop(), stopped, back,
		map[corev1.IPFamily][]string{v4: keys(vm0, vm1), v6: keys(vm0, vm1)})

	// The withdrawal wrote the smtp slices of node-a (both families) and nothing else.
	for name, s := range during {
		if name == "mail-smtp-node-a" || name == "mail-smtp--node-a-ipv6" {
			assert.NotEqual(t, before[name].ResourceVersion, s.ResourceVersion, "%s was written", name)
			continue
		}
		assert.Equal(t, before[name].ResourceVersion, s.ResourceVersion, "%s was not written", name)
	}
}

// An ipFamilies: [IPv6] resource gets an IPv6-only Service and publishes IPv6 slices only, for
// dual-stack pods (their IPv4 addresses are left out) and IPv6-only pods alike. An IPv6-only pod
// is probed at its IPv6 address, the only one it has; the loop through the IPv6 ClusterIP
// reaches both pods with zero failures.
func TestAnIPv6ResourcePublishesIPv6SlicesOnly(t *testing.T) {
	s := shared.Get(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "v6")
	labels := map[string]string{"app": "web"}
	dual := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-dual", Node: "node-a", Labels: labels, ContainerPorts: webPorts})
	only6 := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-v6", Node: "node-b", Labels: labels, ContainerPorts: webPorts, IPFamilies: v6only})
	dual.ServeHTTP(t, 8080)
	srv6 := only6.ServeHTTP(t, 8080)
	swh := kit.Resource(ns, "web", labels, []v1alpha1.ServicePort{e2e.ServicePort("http", 80, intstr.FromString("http"))}, kit.HTTPProbe(intstr.FromInt32(8080)))
	swh.Spec.IPFamilies = v6only
	createResource(t, c, swh, v6only)
	eventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{
		"web-http--node-a-ipv6": {addr(t, dual, v6): "TTF"},
		"web-http--node-b-ipv6": {addr(t, only6, v6): "TTF"},
	})
	assert.Positive(t, srv6.Hits(), "the IPv6-only pod's server was probed (no request was sent to it yet)")
	c.WaitProgrammedOf(t, ns+"/web", 80, v6, dual, only6)
	eventuallyStatus(t, c, ns, "web", "http 2/2", metav1.ConditionTrue, "every port has a ready endpoint")

	l := startLoops(t, c, ns+"/web", 80, cluster.HTTP, v6only)
	l.waitAfter(t, time.Now())
	start := time.Now()
	l.waitAfter(t, start)
	end := time.Now()
	l.waitAfter(t, end)
	requireNoFailure(t, "an IPv6 resource over its IPv6 ClusterIP", l.stop(), start, end,
		map[corev1.IPFamily][]string{v6: keys(dual, only6)})

	// The probe of the IPv6-only pod follows its server: failing, the pod is withdrawn.
	srv6.SetHTTPStatus(503)
	eventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{
		"web-http--node-a-ipv6": {addr(t, dual, v6): "TTF"},
		"web-http--node-b-ipv6": {addr(t, only6, v6): "FFF"},
	})
	c.WaitProgrammedOf(t, ns+"/web", 80, v6, dual)
	svc := &corev1.Service{}
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(swh), svc))
	assert.Len(t, svc.Spec.ClusterIPs, 1, "the Service is IPv6 only")
}

// A pod that has only an IPv4 address is published in the IPv4 slice of a dual-stack resource
// and is absent from its IPv6 slice. The status counts it like any pod (http 2/2) and the
// resource is available: every port has a ready endpoint in each family. IPv4 requests reach
// both pods, IPv6 requests the dual-stack one, with zero failures.
func TestAnIPv4OnlyPodOfADualStackResourceIsPublishedOverIPv4Only(t *testing.T) {
	s := shared.Get(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "v4pod")
	labels := map[string]string{"app": "web"}
	dual := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-dual", Node: "node-a", Labels: labels, ContainerPorts: webPorts})
	only4 := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-v4", Node: "node-b", Labels: labels, ContainerPorts: webPorts, IPFamilies: v4only})
	dual.ServeHTTP(t, 8080)
	only4.ServeHTTP(t, 8080)
	createResource(t, c, requireDualStack(kit.Resource(ns, "web", labels,
		[]v1alpha1.ServicePort{e2e.ServicePort("http", 80, intstr.FromString("http"))}, kit.HTTPProbe(intstr.FromInt32(8080)))), both)
	eventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-a":       {addr(t, dual, v4): "TTF"},
		"web-http--node-a-ipv6": {addr(t, dual, v6): "TTF"},
		"web-http-node-b":       {addr(t, only4, v4): "TTF"},
	})
	c.WaitProgrammedOf(t, ns+"/web", 80, v4, dual, only4)
	c.WaitProgrammedOf(t, ns+"/web", 80, v6, dual)
	eventuallyStatus(t, c, ns, "web", "http 2/2", metav1.ConditionTrue, "every port has a ready endpoint")

	l := startLoops(t, c, ns+"/web", 80, cluster.HTTP, both)
	l.waitAfter(t, time.Now())
	start := time.Now()
	l.waitAfter(t, start)
	end := time.Now()
	l.waitAfter(t, end)
	requireNoFailure(t, "an IPv4-only pod in a dual-stack resource", l.stop(), start, end,
		map[corev1.IPFamily][]string{v4: keys(dual, only4), v6: keys(dual)})

	// Without the dual-stack pod the resource has no IPv6 endpoint: the status says which
	// family of which port lacks one, and counts the pod that is left.
	dual.Delete(t)
	eventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-b": {addr(t, only4, v4): "TTF"},
	})
	eventuallyStatus(t, c, ns, "web", "http 1/1", metav1.ConditionFalse, "no ready endpoint for port http (IPv6)")
}
