// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package gc decides which EndpointSlices of this module no longer belong to anything. The
// decision is a pure function; the reconciler confirms it against the API server and deletes.
//
// Owner references alone are not enough: envtest runs no garbage collector, clusters may lag,
// and a node or a port going away leaves no owner behind to collect the slice.
package gc

import (
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// Reason says why a slice is garbage. The values are metric label values: keep them few.
type Reason string

// The reasons a slice is garbage.
const (
	// ResourceDeleted: the ServiceWithHealthchecks the slice was published for is gone.
	ResourceDeleted Reason = "ResourceDeleted"
	// OwnerMismatch: the slice's owner UID is not the live resource's (a deleted resource of
	// the same name, or no owner reference at all).
	OwnerMismatch Reason = "OwnerMismatch"
	// PortRemoved: the port the slice publishes is no longer a port of the resource.
	PortRemoved Reason = "PortRemoved"
	// NodeDeleted: the node the slice was published for no longer exists, or the slice does
	// not say which node it is for.
	NodeDeleted Reason = "NodeDeleted"
	// NameNotItsNode: the slice's name is not one its node's agent gives it
	// (slicemeta.NameIsItsNodes): it holds a name of another node's slice (squatting, issue 40).
	// The agents' admission policy refuses such names where CEL can compute them; the digest of
	// a long node name it cannot, and the controller removes those.
	NameNotItsNode Reason = "NameNotItsNode"
)

// Input is what the controller observed for one resource name in one namespace.
type Input struct {
	// Resource is the live resource, nil when no resource of that name exists.
	Resource *v1alpha1.ServiceWithHealthchecks
	// Nodes holds the names of the nodes that exist.
	Nodes sets.Set[string]
	// Slices are the EndpointSlices published for that resource name.
	Slices []discoveryv1.EndpointSlice
}

// Garbage is a slice to delete and why.
type Garbage struct {
	// Slice to delete.
	Slice *discoveryv1.EndpointSlice
	// Reason it is garbage.
	Reason Reason
}

// Decide returns the slices to delete. A slice another controller manages is never garbage, and
// neither is a slice of the live resource for one of its ports on an existing node.
func Decide(in Input) []Garbage {
	var ports sets.Set[string]
	if in.Resource != nil {
		ports = sets.New[string]()
		for i := range in.Resource.Spec.Ports {
			ports.Insert(in.Resource.Spec.Ports[i].Name)
		}
		if len(in.Resource.Spec.Ports) == 0 {
			// A resource without ports (headless) publishes port-less slices, port label "".
			ports.Insert("")
		}
	}
	var out []Garbage
	for i := range in.Slices {
		s := &in.Slices[i]
		if r, garbage := decide(s, in.Resource, ports, in.Nodes); garbage {
			out = append(out, Garbage{Slice: s, Reason: r})
		}
	}
	return out
}

func decide(s *discoveryv1.EndpointSlice, swh *v1alpha1.ServiceWithHealthchecks, ports, nodes sets.Set[string]) (Reason, bool) {
	if !slicemeta.IsManaged(s) {
		return "", false
	}
	if swh == nil {
		return ResourceDeleted, true
	}
	if !slicemeta.IsOwnedBy(s, swh.UID) {
		return OwnerMismatch, true
	}
	if port, ok := slicemeta.PortOf(s); !ok || !ports.Has(port) {
		return PortRemoved, true
	}
	if node := slicemeta.NodeOf(s); node == "" || !nodes.Has(node) {
		return NodeDeleted, true
	}
	if !slicemeta.NameIsItsNodes(s) {
		return NameNotItsNode, true
	}
	return "", false
}
