// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package index holds the informer indexes through which the controller reads this module's
// EndpointSlices instead of listing them all: by the resource a slice was published for (a
// reconcile reads one resource's slices) and by the node it was published for (a deleted node,
// a changed liveness judgement and the withdrawal of a stale node's endpoints read one node's
// slices). Each costs one entry per slice in the cache, and turns a read that grew with every
// slice of a namespace or of the cluster into one that grows with what it returns.
package index

import (
	"context"
	"fmt"

	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
)

// Names of the indexes, for client.MatchingFields on a cache-backed client.
const (
	// SliceResource indexes this module's slices by slicemeta.ResourceOf. Combined with
	// client.InNamespace it finds one resource's slices.
	SliceResource = "swh.resource"
	// SliceNode indexes this module's slices by slicemeta.NodeOf, across namespaces.
	SliceNode = "swh.node"
	// SlicePod indexes this module's slices by the names of the Pods their endpoints' targetRefs
	// name (at most MaxPodsIndexed per slice). Combined with client.InNamespace it finds the
	// slices that name one Pod: the audit judges them again when that Pod changes.
	SlicePod = "swh.pod"
)

// MaxPodsIndexed bounds the SlicePod values of one slice: the most endpoints a slice holds.
const MaxPodsIndexed = 1000

// SlicePodsOf is the value of SlicePod for obj: the names of the Pods (kind Pod, core group)
// its endpoints' targetRefs name, each once, at most MaxPodsIndexed.
func SlicePodsOf(obj client.Object) []string {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok || !slicemeta.IsManaged(s) {
		return nil
	}
	var out []string
	seen := map[string]bool{}
	for i := range s.Endpoints {
		ref := s.Endpoints[i].TargetRef
		if ref == nil || ref.Kind != "Pod" || ref.Name == "" || seen[ref.Name] {
			continue
		}
		if len(out) == MaxPodsIndexed {
			break
		}
		seen[ref.Name] = true
		out = append(out, ref.Name)
	}
	return out
}

// SliceResourceOf is the value of SliceResource for obj: the resource a slice of this module
// was published for; none for a slice of another manager or one that names no resource.
func SliceResourceOf(obj client.Object) []string {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok || !slicemeta.IsManaged(s) {
		return nil
	}
	if name := slicemeta.ResourceOf(s); name != "" {
		return []string{name}
	}
	return nil
}

// SliceNodeOf is the value of SliceNode for obj: the node a slice of this module was published
// for; none for a slice of another manager or one that names no node.
func SliceNodeOf(obj client.Object) []string {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok || !slicemeta.IsManaged(s) {
		return nil
	}
	if n := slicemeta.NodeOf(s); n != "" {
		return []string{n}
	}
	return nil
}

// Register adds the indexes to indexer (a manager's field indexer, before its cache starts).
// Call it once per manager: a second registration of the same index fails.
func Register(ctx context.Context, indexer client.FieldIndexer) error {
	if err := indexer.IndexField(ctx, &discoveryv1.EndpointSlice{}, SliceResource, SliceResourceOf); err != nil {
		return fmt.Errorf("indexing EndpointSlices by resource: %w", err)
	}
	if err := indexer.IndexField(ctx, &discoveryv1.EndpointSlice{}, SliceNode, SliceNodeOf); err != nil {
		return fmt.Errorf("indexing EndpointSlices by node: %w", err)
	}
	if err := indexer.IndexField(ctx, &discoveryv1.EndpointSlice{}, SlicePod, SlicePodsOf); err != nil {
		return fmt.Errorf("indexing EndpointSlices by the Pods they name: %w", err)
	}
	return nil
}
