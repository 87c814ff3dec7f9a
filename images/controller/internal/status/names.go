// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package status

import (
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// Collisions lists, for the ports of swh, the (resource, port) pairs of the neighbours whose
// slice names collide with swh's on every node: the same slicemeta.Prefix. Collisions that
// depend on node names are not detected.
func Collisions(swh *v1alpha1.ServiceWithHealthchecks, neighbours []v1alpha1.ServiceWithHealthchecks) []string {
	var out []string
	for _, p := range swh.Spec.Ports {
		mine := slicemeta.Prefix(swh.Name, p.Name)
		for i := range neighbours {
			n := &neighbours[i]
			if n.Name == swh.Name || n.Namespace != swh.Namespace || n.DeletionTimestamp != nil {
				continue
			}
			for _, q := range n.Spec.Ports {
				if slicemeta.Prefix(n.Name, q.Name) == mine {
					out = append(out, fmt.Sprintf("port %s collides with resource %s, port %s", p.DisplayName(), n.Name, q.DisplayName()))
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// CollisionCandidates are the names of the only resources of swh's namespace that Collisions
// can find colliding with swh, so that the caller reads those by name instead of listing the
// namespace. Prefix(n, q) ends with "-"; it equals Prefix(swh.Name, p) = P only if
//
//   - q is empty and n is P without its last dash (for p empty that is swh itself), or
//   - q is not empty and n is the part of P before one of its other dashes (q is the rest,
//     without the last dash).
//
// So the candidates are the parts of each of swh's prefixes before each of its dashes, swh's own
// name left out; sorted and without duplicates. For a port p the last one is swh.Name+"-"+p (a
// resource of that name with an unnamed port); no name longer than a prefix can collide with
// it, so with an unnamed port only names shorter than swh.Name are candidates. Without ports
// there are none (Collisions looks only at ports).
func CollisionCandidates(swh *v1alpha1.ServiceWithHealthchecks) []string {
	var out []string
	for _, p := range swh.Spec.Ports {
		prefix := slicemeta.Prefix(swh.Name, p.Name)
		for i := range len(prefix) {
			if prefix[i] == '-' && prefix[:i] != swh.Name && prefix[:i] != "" {
				out = append(out, prefix[:i])
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func nameConflict(swh *v1alpha1.ServiceWithHealthchecks, neighbours []v1alpha1.ServiceWithHealthchecks) metav1.Condition {
	if c := Collisions(swh, neighbours); len(c) > 0 {
		return metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonNameCollision,
			Message: "EndpointSlice names collide on every node, neither resource's slices are overwritten: " + strings.Join(c, "; ")}
	}
	return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonNoCollision, Message: "no slice name collides with another resource's"}
}
