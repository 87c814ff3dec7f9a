// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package status

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

func TestCollisionCandidates(t *testing.T) {
	named := func(names ...string) []v1alpha1.ServicePort {
		var out []v1alpha1.ServicePort
		for _, n := range names {
			out = append(out, v1alpha1.ServicePort{Name: n, Port: 80})
		}
		return out
	}
	tests := map[string]struct {
		name  string
		ports []v1alpha1.ServicePort
		want  []string
	}{
		"a named port: the name with the port, and nothing shorter without dashes": {
			name: "web", ports: named("http"), want: []string{"web-http"},
		},
		"a port with a dash adds the part before it": {
			name: "a", ports: named("b-c"), want: []string{"a-b", "a-b-c"},
		},
		"a name with dashes adds the parts before them": {
			name: "a-b", ports: named("c"), want: []string{"a", "a-b-c"},
		},
		"an unnamed port: only the parts of the name before its dashes": {
			name: "a-b-c", ports: named(""), want: []string{"a", "a-b"},
		},
		"an unnamed port of a name without dashes has no candidate": {
			name: "web", ports: named(""),
		},
		"several ports: the union, sorted, each once": {
			name: "a-b", ports: named("c", "d-e"), want: []string{"a", "a-b-c", "a-b-d", "a-b-d-e"},
		},
		"no ports, no candidates": {
			name: "a-b",
		},
		"dots are not dashes": {
			name: "a.b", ports: named("c"), want: []string{"a.b-c"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			swh := resource(tc.name, tc.ports...)
			assert.Equal(t, tc.want, CollisionCandidates(swh))
		})
	}
}

// TestCollisionCandidatesFindEveryCollision checks the rule against Collisions itself, pair by
// pair, over every name made of up to three pieces and every port of a set with and without
// dashes: two pairs of different resources collide exactly when their prefixes are equal, and
// then each resource is a candidate of the other.
func TestCollisionCandidatesFindEveryCollision(t *testing.T) {
	pieces := []string{"a", "b", "c", "x.y"}
	var names []string
	var join func(prefix string, depth int)
	join = func(prefix string, depth int) {
		for _, p := range pieces {
			n := p
			if prefix != "" {
				n = prefix + "-" + p
			}
			names = append(names, n)
			if depth > 1 {
				join(n, depth-1)
			}
		}
	}
	join("", 3)
	ports := []string{"", "a", "b", "c", "a-b", "b-c", "a-b-c"}
	collisions := 0
	for _, n1 := range names {
		for _, p1 := range ports {
			one := resource(n1, v1alpha1.ServicePort{Name: p1, Port: 80})
			candidates := CollisionCandidates(one)
			for _, n2 := range names {
				if n2 == n1 {
					continue
				}
				for _, p2 := range ports {
					other := resource(n2, v1alpha1.ServicePort{Name: p2, Port: 80})
					collide := len(Collisions(one, []v1alpha1.ServiceWithHealthchecks{*other})) > 0
					if collide != (slicemeta.Prefix(n1, p1) == slicemeta.Prefix(n2, p2)) {
						t.Fatalf("Collisions(%s/%s, %s/%s) = %v disagrees with the prefixes", n1, p1, n2, p2, collide)
					}
					if collide {
						collisions++
						if !slices.Contains(candidates, n2) {
							t.Errorf("%s port %q collides with %s port %q, which is not among its candidates %v", n1, p1, n2, p2, candidates)
						}
					}
				}
			}
		}
	}
	// The enumeration holds collisions of every shape: a dash in the name, in the port, and an
	// unnamed port against a named one.
	assert.Greater(t, collisions, 100, "the enumeration must contain collisions to check")
}
