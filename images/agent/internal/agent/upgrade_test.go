// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// stripNodeKeys makes the resource's slices look as an agent of before the node key label
// wrote them.
func stripNodeKeys(t *testing.T, c *cluster.Cluster, ns, resource string) {
	t.Helper()
	var list discoveryv1.EndpointSliceList
	require.NoError(t, c.Env.Client.List(t.Context(), &list, client.InNamespace(ns), client.MatchingLabels{wellknown.LabelResource: resource}))
	require.NotEmpty(t, list.Items)
	for i := range list.Items {
		s := &list.Items[i]
		delete(s.Labels, wellknown.LabelNodeKey)
		require.NoError(t, c.Env.Client.Update(t.Context(), s))
	}
}

// The agent's cache holds only its node's slices, selected by the node key label (issue 19).
// An agent upgraded from a version that did not write the label finds the slices its
// predecessor published all the same, labels them, and carries their verdicts over: no
// endpoint flaps while the new agent's probes have not decided yet. Without the relabelling,
// the new agent would not see them, and its first write would drop every undecided endpoint.
func TestAnUpgradedAgentAdoptsSlicesWithoutTheNodeKeyWithoutFlapping(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "upgrade")
	labels := map[string]string{"app": "web"}
	pass := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-pass", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	fail := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-fail", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	pass.ServeHTTP(t, 8080)
	const failureThreshold = 3
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))}, httpProbe(intstr.FromInt32(8080), 2, failureThreshold))
	first := startAgent(t, c, "node-a")
	want := map[string]map[string]string{"web-http-node-a": {ip(pass): "TTF", ip(fail): "FFF"}}
	eventuallySlices(t, c, ns, "web", want)
	first.stop()
	stripNodeKeys(t, c, ns, "web")

	w := watchSlices(t, c, ns)
	second := startAgent(t, c, "node-a")
	// The new agent labels the slice (one write), then both targets reach their decisive
	// results (2 passes, failureThreshold failures) and the agent reconciles: nothing else is
	// written, and the endpoints never change.
	second.waitSettled(t)
	assert.Equal(t, []string{"MODIFIED web-http-node-a"}, w.Events(), "one write: the label")
	got := eventuallySlices(t, c, ns, "web", want)
	assert.NotEmpty(t, got["web-http-node-a"].RV)
	s := &discoveryv1.EndpointSlice{}
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "web-http-node-a"}, s))
	assert.Equal(t, "node-a", s.Labels[wellknown.LabelNodeKey], "the slice carries its node key now")
	assert.Empty(t, s.ManagedFields, "the label is written as every update is: without managedFields")
	assert.Equal(t, 0.0, testutil.ToFloat64(second.Metrics.SliceWriteErrors.WithLabelValues("update")))
	assert.Equal(t, 1.0, testutil.ToFloat64(second.Metrics.SliceWrites.WithLabelValues("update")), "the label is counted as the publisher's one update")
}

// A slice of this node written before the node key label that the API server refuses to change
// (Forbidden: here a ValidatingAdmissionPolicy refuses every update of it, as the chart's
// policy refuses a legacy slice for a reserved Service) does not stop the agent: the start-up
// labelling tries it once, skips it, and the agent goes on to publish its resources. Removing
// such a slice is the controller's audit's (development/CONTROLLER.md).
func TestLegacySliceWhoseLabellingIsRefusedDoesNotStopTheAgent(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "legacy")
	key := slicemeta.SliceKey{Resource: "old", Port: "http", Node: "node-a"}
	legacyLabels := key.Labels()
	delete(legacyLabels, wellknown.LabelNodeKey)
	legacy := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: key.Name(), Labels: legacyLabels, Annotations: key.Annotations(),
			OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference("old", "old-uid")},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses: []string{"10.9.9.9"}, NodeName: ptr.To("node-a"),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), legacy))
	refuseSliceUpdates(t, c, ns, "old")
	require.Eventually(t, func() bool { return refused(t, c, ns, legacy.Name) }, time.Minute, 100*time.Millisecond,
		"the API server refuses to change the legacy slice")

	labels := map[string]string{"app": "web"}
	p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	p.ServeHTTP(t, 8080)
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))}, httpProbe(intstr.FromInt32(8080), 1, 1))
	a := startAgent(t, c, "node-a")
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(p): "TTF"}})

	assert.GreaterOrEqual(t, testutil.ToFloat64(a.Metrics.SliceWriteErrors.WithLabelValues("update")), 1.0, "the labelling was tried and refused")
	got := &discoveryv1.EndpointSlice{}
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(legacy), got))
	assert.NotContains(t, got.Labels, wellknown.LabelNodeKey, "the refused slice is skipped, unchanged")
	assert.Equal(t, legacy.ResourceVersion, got.ResourceVersion)
}
