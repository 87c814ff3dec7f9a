// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"testing"
	"time"

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
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// TestSquatOfItsNameIsUndoneAndTheAgentPublishes: another node's agent holds node-a's slice name
// (its own content, no endpoints, annotated for its own node, for the live resource: what the
// agents' admission policy cannot refuse when the name is a digest). node-a's agent reports the
// name taken and publishes its other port. When the squatter goes (the controller deletes it:
// gc.NameNotItsNode), node-a's agent publishes the name within a probe period of the
// resource (it looks again that soon while a squatter holds a name), not after ConflictRecheck:
// the deadline is half of the recheck, so the test fails when only the recheck brings the agent
// back. Positive control: node-b's honest slice of the same resource, under
// its own name, is no squatter and does not make node-a reconcile anything away.
func TestSquatOfItsNameIsUndoneAndTheAgentPublishes(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "squat")
	labels := map[string]string{"app": "web"}
	p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts, ObjectOnly: true})
	swh := createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080)), namedPort("smtp", 25, intstr.FromInt32(2525))})

	// The squatter: node-b's slice of port http under node-a's name.
	victim := slicemeta.SliceKey{Resource: "web", Port: "http", Node: "node-a"}
	squatter := nodeSlice(ns, swh, slicemeta.SliceKey{Resource: "web", Port: "http", Node: "node-b"})
	squatter.Name = victim.Name()
	require.False(t, slicemeta.NameIsItsNodes(squatter), "the squatter's name is not its node's")
	require.NoError(t, c.Env.Client.Create(t.Context(), squatter))
	honest := nodeSlice(ns, swh, slicemeta.SliceKey{Resource: "web", Port: "smtp", Node: "node-b"})
	require.True(t, slicemeta.NameIsItsNodes(honest))
	require.NoError(t, c.Env.Client.Create(t.Context(), honest))

	startAgent(t, c, "node-a", withRunner(&switchRunner{fail: map[string]bool{}}))
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{
		victim.Name():     {},
		"web-smtp-node-a": {ip(p): "TTF"},
		honest.Name:       {},
	})
	eventuallyEvent(t, c, ns, agent.ReasonSliceNameTaken, "web: EndpointSlice "+victim.Name()+` is held by the slice of resource "web", port "http", node "node-b", whose name is not that node's`)

	require.NoError(t, c.Env.Client.Delete(t.Context(), squatter))
	deleted := time.Now()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		var s discoveryv1.EndpointSlice
		require.NoError(ct, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: victim.Name()}, &s))
		assert.Equal(ct, "node-a", slicemeta.NodeOf(&s), "node-a's agent published its name")
		if assert.Len(ct, s.Endpoints, 1) {
			assert.Equal(ct, ip(p), s.Endpoints[0].Addresses[0])
		}
	}, agent.ConflictRecheck/2, 50*time.Millisecond, "node-a's agent publishes within a probe period of the squatter's deletion, not after its conflict recheck")
	// A figure for docs/SECURITY.md, not a bound (the deadline above is the bound).
	t.Logf("node-a's agent published %s %s after the squatter's deletion (probe period 1s)", victim.Name(), time.Since(deleted).Round(time.Millisecond))
	var kept discoveryv1.EndpointSlice
	assert.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(honest), &kept), "node-b's honest slice stays")
}

// nodeSlice is the empty slice of key, as the agent of key.Node names and labels it, for swh.
func nodeSlice(ns string, swh *v1alpha1.ServiceWithHealthchecks, key slicemeta.SliceKey) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: key.Name(), Labels: key.Labels(), Annotations: key.Annotations(),
			OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference(swh.Name, swh.UID)},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(key.Port), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
}
