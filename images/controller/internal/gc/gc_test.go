// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package gc

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

const liveUID = types.UID("live-uid")

func resource(ports ...string) *v1alpha1.ServiceWithHealthchecks {
	swh := &v1alpha1.ServiceWithHealthchecks{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "apps", UID: liveUID}}
	for i, p := range ports {
		swh.Spec.Ports = append(swh.Spec.Ports, v1alpha1.ServicePort{Name: p, Protocol: corev1.ProtocolTCP, Port: int32(80 + i)})
	}
	return swh
}

type sliceOpt func(*discoveryv1.EndpointSlice)

func slice(port, node string, opts ...sliceOpt) discoveryv1.EndpointSlice {
	key := slicemeta.SliceKey{Resource: "web", Port: port, Node: node}
	s := discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: key.Name(), Namespace: "apps", Labels: key.Labels(), Annotations: key.Annotations(),
			OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference("web", liveUID)},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, o := range opts {
		o(&s)
	}
	return s
}

func managedBy(v string) sliceOpt {
	return func(s *discoveryv1.EndpointSlice) { s.Labels[discoveryv1.LabelManagedBy] = v }
}

func ownedBy(uid types.UID) sliceOpt {
	return func(s *discoveryv1.EndpointSlice) {
		s.OwnerReferences = []metav1.OwnerReference{slicemeta.OwnerReference("web", uid)}
	}
}

func noOwner(s *discoveryv1.EndpointSlice) { s.OwnerReferences = nil }

func noNode(s *discoveryv1.EndpointSlice) {
	delete(s.Annotations, wellknown.AnnotationNode)
	delete(s.Labels, wellknown.LabelNode)
}

func named(name string) sliceOpt {
	return func(s *discoveryv1.EndpointSlice) { s.Name = name }
}

func noPortLabel(s *discoveryv1.EndpointSlice) { delete(s.Labels, wellknown.LabelPort) }

func TestDecide(t *testing.T) {
	nodes := sets.New("n1", "n2")
	tests := map[string]struct {
		resource *v1alpha1.ServiceWithHealthchecks
		slice    discoveryv1.EndpointSlice
		want     Reason // "" means the slice survives
	}{
		"ours for a live node and port survives":                         {resource: resource("http"), slice: slice("http", "n1")},
		"ours for a single unnamed port on a live node survives":         {resource: resource(""), slice: slice("", "n2")},
		"another controller's slice survives even for a gone node":       {resource: resource("http"), slice: slice("http", "gone", managedBy("endpointslice-controller.k8s.io"))},
		"another controller's slice survives when the resource is gone":  {resource: nil, slice: slice("http", "n1", managedBy("someone-else"))},
		"a slice without managed-by survives":                            {resource: nil, slice: slice("http", "n1", managedBy(""))},
		"ours of a deleted resource is garbage":                          {resource: nil, slice: slice("http", "n1"), want: ResourceDeleted},
		"ours owned by a deleted UID of the same name is garbage":        {resource: resource("http"), slice: slice("http", "n1", ownedBy("old-uid")), want: OwnerMismatch},
		"ours without an owner reference is garbage":                     {resource: resource("http"), slice: slice("http", "n1", noOwner), want: OwnerMismatch},
		"ours for a removed port is garbage":                             {resource: resource("http"), slice: slice("metrics", "n1"), want: PortRemoved},
		"ours for the unnamed port after the ports got names is garbage": {resource: resource("http", "metrics"), slice: slice("", "n1"), want: PortRemoved},
		"ours without a port label is garbage":                           {resource: resource("http"), slice: slice("http", "n1", noPortLabel), want: PortRemoved},
		"ours for a deleted node is garbage":                             {resource: resource("http"), slice: slice("http", "gone"), want: NodeDeleted},
		"a port-less slice of a resource without ports survives":         {resource: resource(), slice: slice("", "n1")},
		"a port-less slice of a resource that got ports is garbage":      {resource: resource("http"), slice: slice("", "n1"), want: PortRemoved},
		"ours that names no node is garbage":                             {resource: resource("http"), slice: slice("http", "n1", noNode), want: NodeDeleted},
		"ours of n1 under n2's name is garbage (squat)":                  {resource: resource("http"), slice: slice("http", "n1", named("web-http-n2")), want: NameNotItsNode},
		"ours of n1 under n2's chunk name is garbage (squat)":            {resource: resource("http"), slice: slice("http", "n1", named("web-http---2-n2")), want: NameNotItsNode},
		"ours of n1 under a digest is garbage (squat)":                   {resource: resource("http"), slice: slice("http", "n1", named("web-http-0123456789abcdef")), want: NameNotItsNode},
		"ours of a chunk of n1 survives":                                 {resource: resource("http"), slice: slice("http", "n1", named("web-http---2-n1"))},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := Decide(Input{Resource: tc.resource, Nodes: nodes, Slices: []discoveryv1.EndpointSlice{tc.slice}})
			if tc.want == "" {
				assert.Empty(t, got)
				return
			}
			if assert.Len(t, got, 1) {
				assert.Equal(t, tc.want, got[0].Reason)
				assert.Equal(t, tc.slice.Name, got[0].Slice.Name)
			}
		})
	}
}

func TestDecideKeepsTheLiveAmongTheGarbage(t *testing.T) {
	slices := []discoveryv1.EndpointSlice{
		slice("http", "n1"),
		slice("http", "gone"),
		slice("metrics", "n1"),
		slice("http", "n2", managedBy("endpointslice-controller.k8s.io")),
	}
	got := Decide(Input{Resource: resource("http"), Nodes: sets.New("n1", "n2"), Slices: slices})
	names := map[string]Reason{}
	for _, g := range got {
		names[g.Slice.Name] = g.Reason
	}
	assert.Equal(t, map[string]Reason{"web-http-gone": NodeDeleted, "web-metrics-n1": PortRemoved}, names)
}
