// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package dualstack_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// builtInEndpoints reads the built-in controller's slices of a Service as family -> address ->
// "RST".
func builtInEndpoints(ctx context.Context, c *cluster.Cluster, ns, service string) (map[discoveryv1.AddressType]map[string]string, error) {
	var list discoveryv1.EndpointSliceList
	if err := c.Env.Client.List(ctx, &list, client.InNamespace(ns),
		client.MatchingLabels{discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: e2e.BuiltInManagedBy}); err != nil {
		return nil, fmt.Errorf("listing the built-in slices of %s/%s: %w", ns, service, err)
	}
	out := map[discoveryv1.AddressType]map[string]string{}
	for _, s := range list.Items {
		if out[s.AddressType] == nil {
			out[s.AddressType] = map[string]string{}
		}
		for _, e := range s.Endpoints {
			out[s.AddressType][e.Addresses[0]] = e2e.Conds(e.Conditions)
		}
	}
	return out, nil
}

// Migrating a live dual-stack Service (DESIGN §11): a RequireDualStack Service with a selector,
// served over both ClusterIPs by the real built-in controller's slices of each family, is adopted
// by a new ServiceWithHealthchecks of the same name. The controller clears the selector only once
// this module's slices have a ready endpoint in both families (then the built-in slices go), so
// loops through the IPv4 and the IPv6 ClusterIP see zero failures from the creation of the
// resource until the probed endpoints serve; both ClusterIPs are kept.
func TestALiveDualStackServiceIsAdoptedWithoutAFailedRequest(t *testing.T) {
	s := shared.Get(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "migrate")
	e2e.StartEndpointSliceController(t, s)
	labels := map[string]string{"app": "web"}
	a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-a", Node: "node-a", Labels: labels, ContainerPorts: webPorts})
	b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-b", Node: "node-b", Labels: labels, ContainerPorts: webPorts})
	a.ServeHTTP(t, 8080)
	b.ServeHTTP(t, 8080)
	policy := corev1.IPFamilyPolicyRequireDualStack
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web", Annotations: map[string]string{wellknown.AnnotationAdopt: "true"}},
		Spec: corev1.ServiceSpec{
			Selector:       labels,
			IPFamilyPolicy: &policy,
			Ports:          []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), svc))
	require.Len(t, svc.Spec.ClusterIPs, 2)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		eps, err := builtInEndpoints(t.Context(), c, ns, "web")
		require.NoError(ct, err)
		assert.Equal(ct, map[discoveryv1.AddressType]map[string]string{
			discoveryv1.AddressTypeIPv4: {addr(t, a, v4): "TTF", addr(t, b, v4): "TTF"},
			discoveryv1.AddressTypeIPv6: {addr(t, a, v6): "TTF", addr(t, b, v6): "TTF"},
		}, eps)
	}, waitFor, poll, "the built-in controller publishes the live Service's pods in both families")
	for _, f := range both {
		c.WaitProgrammedOf(t, ns+"/web", 80, f, a, b)
	}

	l := startLoops(t, c, ns+"/web", 80, cluster.HTTP, both)
	l.waitAfter(t, time.Now())
	adopting := time.Now()
	probe := kit.HTTPProbe(intstr.FromInt32(8080))
	probe.SuccessThreshold = 3 // the agents publish a few seconds in, under the running loops
	swh := requireDualStack(kit.Resource(ns, "web", labels, []v1alpha1.ServicePort{e2e.ServicePort("http", 80, intstr.FromInt32(8080))}, probe))
	require.NoError(t, c.Env.Client.Create(t.Context(), swh))
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		got := &corev1.Service{}
		require.NoError(ct, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(svc), got))
		assert.Empty(ct, got.Spec.Selector, "the selector is cleared")
		cur := &v1alpha1.ServiceWithHealthchecks{}
		require.NoError(ct, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(swh), cur))
		cond := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionServiceSynced)
		require.NotNil(ct, cond)
		assert.Equal(ct, metav1.ConditionTrue, cond.Status, "%s: %s", cond.Reason, cond.Message)
	}, waitFor, poll, "the controller adopts the Service and clears its selector")
	cleared := time.Now()
	eventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-a":       {addr(t, a, v4): "TTF"},
		"web-http--node-a-ipv6": {addr(t, a, v6): "TTF"},
		"web-http-node-b":       {addr(t, b, v4): "TTF"},
		"web-http--node-b-ipv6": {addr(t, b, v6): "TTF"},
	})
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		eps, err := builtInEndpoints(t.Context(), c, ns, "web")
		require.NoError(ct, err)
		assert.Empty(ct, eps, "no built-in slice is left")
	}, waitFor, poll, "the built-in slices go once the selector is cleared")
	for _, f := range both {
		c.WaitProgrammedOf(t, ns+"/web", 80, f, a, b)
	}
	switched := time.Now()
	l.waitAfter(t, switched)
	requireNoFailure(t, "migration of a live dual-stack Service", l.stop(), adopting, switched,
		map[corev1.IPFamily][]string{v4: keys(a, b), v6: keys(a, b)})
	got := &corev1.Service{}
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(svc), got))
	assert.Equal(t, svc.Spec.ClusterIPs, got.Spec.ClusterIPs, "both ClusterIPs are kept")
	assert.Equal(t, svc.UID, got.UID, "it is the same Service object")
	t.Logf("dual-stack migration: selector cleared %s after the resource was created, probed endpoints serving after %s",
		cleared.Sub(adopting).Round(time.Millisecond), switched.Sub(adopting).Round(time.Millisecond))
}
