// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package sliceplan

import (
	"fmt"
	"slices"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
)

// Conflict is a desired slice name held by a slice this agent may not write.
type Conflict struct {
	Name string
	// Holder describes who holds the name, for the Event.
	Holder string
	// Squatted: the holder is a slice of this module whose name is not its node's
	// (slicemeta.NameIsItsNodes, issue 40): the controller deletes it, and the agent looks
	// again within a probe period rather than after ConflictRecheck (its cache holds only its
	// own node's slices, so no event tells it the name is free).
	Squatted bool
}

// Plan is what turns the existing slices into the desired ones. Update entries are copies of
// the existing objects (with their resourceVersion) carrying the desired content.
type Plan struct {
	Create    []*discoveryv1.EndpointSlice
	Update    []*discoveryv1.EndpointSlice
	Delete    []*discoveryv1.EndpointSlice
	Conflicts []Conflict
	// Keys holds the key of every desired slice by name: the publisher checks against it that a
	// slice it retries on, or finds in its way, is still this (resource, port, node)'s.
	Keys map[string]slicemeta.SliceKey
}

// HasChanges tells whether applying the plan writes anything.
func (p Plan) HasChanges() bool {
	return len(p.Create)+len(p.Update)+len(p.Delete) > 0
}

// Diff plans the writes from existing to desired for (resource, node). existing holds, by name,
// the slices this agent knows: its own for (resource, node) and any other slice that holds a
// desired name. A slice is written only when it is ours (managed by us, published for the same
// resource, port and node) and owned by the live resource uid — or when it is ours but owned by
// a deleted resource of the same name, which is garbage the live resource takes over. A name
// held by anything else is a Conflict and is not touched. Own slices of the node that are no
// longer desired are deleted.
func Diff(resource string, uid types.UID, node string, desired []Desired, existing map[string]*discoveryv1.EndpointSlice) Plan {
	p := Plan{Keys: make(map[string]slicemeta.SliceKey, len(desired))}
	want := map[string]bool{}
	for _, d := range desired {
		want[d.Slice.Name] = true
		p.Keys[d.Slice.Name] = d.Key
		cur, ok := existing[d.Slice.Name]
		if !ok {
			p.Create = append(p.Create, d.Slice)
			continue
		}
		if !slicemeta.IsManaged(cur) || !d.Key.Matches(cur) {
			p.Conflicts = append(p.Conflicts, ConflictOf(d.Slice.Name, cur))
			continue
		}
		if u, changed := Merge(cur, d.Slice); changed {
			p.Update = append(p.Update, u)
		}
	}
	names := make([]string, 0, len(existing))
	for name := range existing {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		cur := existing[name]
		if want[name] || !slicemeta.IsOwnedBy(cur, uid) || slicemeta.ResourceOf(cur) != resource || slicemeta.NodeOf(cur) != node {
			continue
		}
		p.Delete = append(p.Delete, cur)
	}
	return p
}

// ConflictOf describes the conflict of a desired name held by cur, a slice this agent may not
// write.
func ConflictOf(name string, cur *discoveryv1.EndpointSlice) Conflict {
	c := Conflict{Name: name}
	switch {
	case !slicemeta.IsManaged(cur):
		if m := cur.Labels[discoveryv1.LabelManagedBy]; m != "" {
			c.Holder = "a slice managed by " + m
		} else {
			c.Holder = "a slice not managed by this module"
		}
	default:
		port, _ := slicemeta.PortOf(cur)
		c.Holder = fmt.Sprintf("the slice of resource %q, port %q, node %q", slicemeta.ResourceOf(cur), port, slicemeta.NodeOf(cur))
		if !slicemeta.NameIsItsNodes(cur) {
			c.Squatted = true
			c.Holder += ", whose name is not that node's (the controller deletes it)"
		}
	}
	return c
}
