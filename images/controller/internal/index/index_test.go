// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package index

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

func TestSliceIndexValues(t *testing.T) {
	agentSlice := func(resource, port, node string) *discoveryv1.EndpointSlice {
		k := slicemeta.SliceKey{Resource: resource, Port: port, Node: node}
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{
			Name: k.Name(), Namespace: "ns", Labels: k.Labels(), Annotations: k.Annotations(),
			OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference(resource, "uid")},
		}}
	}
	longNode := strings.Repeat("n", 70) // not a label value: only the annotation names it
	noResourceLabel := agentSlice("web", "http", "n1")
	delete(noResourceLabel.Labels, wellknown.LabelResource)
	noNode := agentSlice("web", "http", "n1")
	delete(noNode.Annotations, wellknown.AnnotationNode)
	delete(noNode.Labels, wellknown.LabelNode)
	foreign := agentSlice("web", "http", "n1")
	foreign.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
	orphan := agentSlice("web", "http", "n1")
	delete(orphan.Labels, wellknown.LabelResource)
	orphan.OwnerReferences = nil

	tests := map[string]struct {
		obj          client.Object
		wantResource []string
		wantNode     []string
	}{
		"an agent's slice is found by its resource and its node": {
			obj: agentSlice("web", "http", "n1"), wantResource: []string{"web"}, wantNode: []string{"n1"},
		},
		"a node name too long for a label is found by the annotation": {
			obj: agentSlice("web", "", longNode), wantResource: []string{"web"}, wantNode: []string{longNode},
		},
		"a slice without the resource label is found by its owner reference": {
			obj: noResourceLabel, wantResource: []string{"web"}, wantNode: []string{"n1"},
		},
		"a slice that names no node is not found by node": {
			obj: noNode, wantResource: []string{"web"},
		},
		"a slice that names no resource is not found by resource": {
			obj: orphan, wantNode: []string{"n1"},
		},
		"a slice of another manager is in neither index": {
			obj: foreign,
		},
		"an object that is not a slice is in neither index": {
			obj: &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", Labels: agentSlice("web", "http", "n1").Labels}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.wantResource, SliceResourceOf(tc.obj))
			assert.Equal(t, tc.wantNode, SliceNodeOf(tc.obj))
		})
	}
}

func TestSlicePodsOf(t *testing.T) {
	k := slicemeta.SliceKey{Resource: "web", Port: "http", Node: "n1"}
	withRefs := func(refs ...*corev1.ObjectReference) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: k.Name(), Namespace: "ns", Labels: k.Labels(), Annotations: k.Annotations()}}
		for _, r := range refs {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}, TargetRef: r})
		}
		return s
	}
	podRef := func(name string) *corev1.ObjectReference { return &corev1.ObjectReference{Kind: "Pod", Name: name} }
	many := make([]*corev1.ObjectReference, 0, MaxPodsIndexed+5)
	for i := range MaxPodsIndexed + 5 {
		many = append(many, podRef(strings.Repeat("p", 1+i%3)+string(rune('a'+i%26))+strings.Repeat("x", i/26)))
	}
	foreign := withRefs(podRef("a"))
	foreign.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
	tests := map[string]struct {
		obj  client.Object
		want int
		has  []string
	}{
		"each Pod once":                 {withRefs(podRef("a"), podRef("b"), podRef("a")), 2, []string{"a", "b"}},
		"no targetRef, not a Pod, none": {withRefs(nil, &corev1.ObjectReference{Kind: "Node", Name: "n"}, podRef("")), 0, nil},
		"at most MaxPodsIndexed":        {withRefs(many...), MaxPodsIndexed, nil},
		"another manager's slice":       {foreign, 0, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := SlicePodsOf(tc.obj)
			assert.Len(t, got, tc.want)
			for _, h := range tc.has {
				assert.Contains(t, got, h)
			}
		})
	}
}
