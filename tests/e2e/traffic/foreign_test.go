// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import (
	"testing"

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

// A tenant allowed to create ServiceWithHealthchecks in a namespace cannot add pods to a
// Service of that namespace that is not theirs (DESIGN §8, issue 16 part 3): a resource named
// like a plain Service (no adopt annotation) is reported ForeignService and the agents publish
// nothing for it, so the Service keeps exactly the built-in controller's endpoints and no
// request through its ClusterIP reaches the resource's pod. A resource with a free name over
// the same pod is published, so the agents did run for it.
func TestAResourceNamedLikeAForeignServiceAddsNoPodToIt(t *testing.T) {
	s := testStack(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "foreign")
	e2e.StartEndpointSliceController(t, s)

	shopLabels := map[string]string{"app": "shop"}
	shop := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "shop-0", Node: "node-a", Labels: shopLabels, ContainerPorts: webPorts})
	shop.ServeHTTP(t, 8080)
	foreign := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shop"},
		Spec: corev1.ServiceSpec{
			Selector: shopLabels,
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), foreign))
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		eps, _, err := builtInEndpoints(t.Context(), c, ns, "shop")
		require.NoError(ct, err)
		assert.Equal(ct, map[string]string{ip(shop): "TTF"}, eps)
	}, waitFor, poll, "the built-in controller publishes the plain Service's pod")
	c.WaitProgrammed(t, ns+"/shop", 80, shop)

	// The tenant's pod, on the other node, and two resources over it: one named like the
	// plain Service, one with a name of its own.
	mineLabels := map[string]string{"app": "mine"}
	mine := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "mine-0", Node: "node-b", Labels: mineLabels, ContainerPorts: webPorts})
	mine.ServeHTTP(t, 8080)
	ports := []v1alpha1.ServicePort{e2e.ServicePort("http", 80, intstr.FromInt32(8080))}
	impostor := kit.Resource(ns, "shop", mineLabels, ports, kit.HTTPProbe(intstr.FromInt32(8080)))
	require.NoError(t, c.Env.Client.Create(t.Context(), impostor))
	own := kit.Resource(ns, "mine", mineLabels, ports, kit.HTTPProbe(intstr.FromInt32(8080)))
	createResource(t, c, own)

	kit.EventuallyEndpoints(t, c, ns, "mine", map[string]map[string]string{"mine-http-node-b": {ip(mine): "TTF"}})
	c.WaitProgrammed(t, ns+"/mine", 80, mine)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		cur := &v1alpha1.ServiceWithHealthchecks{}
		require.NoError(ct, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(impostor), cur))
		cond := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionServiceSynced)
		if assert.NotNil(ct, cond) {
			assert.Equal(ct, "ForeignService", cond.Reason)
		}
		assert.False(ct, cur.Status.ServiceOwned(), "the status says the Service is not the resource's")
	}, waitFor, poll, "the controller reports the Service as foreign")

	// The resource of its own name was published by the same agents; the impostor has no slice,
	// and the plain Service's slices are exactly the built-in ones.
	var list discoveryv1.EndpointSliceList
	require.NoError(t, c.Env.Client.List(t.Context(), &list, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: "shop"}))
	for _, sl := range list.Items {
		assert.Equal(t, e2e.BuiltInManagedBy, sl.Labels[discoveryv1.LabelManagedBy], "slice %s of Service shop is the built-in controller's", sl.Name)
	}
	eps, n, err := builtInEndpoints(t.Context(), c, ns, "shop")
	require.NoError(t, err)
	assert.Equal(t, map[string]string{ip(shop): "TTF"}, eps)
	assert.Equal(t, 1, n)
	impostorSlices, err := e2e.EndpointsOf(t.Context(), c, ns, "shop")
	require.NoError(t, err)
	assert.Empty(t, impostorSlices, "no slice of the impostor resource")

	res := c.Requests(t, cluster.TrafficOptions{Service: ns + "/shop", Port: 80, Count: minInWindow})
	assert.Equal(t, map[string]int{shop.Key(): minInWindow}, res.ByPod(), "every request through the plain Service reaches its own pod: %s", res)
	assert.NotContains(t, res.ByPod(), mine.Key())
	got := &corev1.Service{}
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(foreign), got))
	assert.Equal(t, foreign.Spec.Selector, got.Spec.Selector, "the plain Service is untouched")
	assert.Empty(t, got.OwnerReferences)
	assert.NotContains(t, got.Annotations, wellknown.AnnotationAdopt)
}
