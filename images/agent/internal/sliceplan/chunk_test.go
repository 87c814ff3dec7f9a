// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package sliceplan

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// published is what the API server holds after the agent carried out each plan: the test feeds
// it back as the existing slices of the next Compute, as observe does.
type published map[string]*discoveryv1.EndpointSlice

func (p published) list() []*discoveryv1.EndpointSlice {
	out := make([]*discoveryv1.EndpointSlice, 0, len(p))
	for _, name := range slices.Sorted(maps.Keys(p)) {
		out = append(out, p[name])
	}
	return out
}

// step computes the slices of the pods with size endpoints per slice, applies the plan to p and
// returns it (names only: which slices were created, updated and deleted).
func (p published) step(t *testing.T, r *v1alpha1.ServiceWithHealthchecks, size int, pods ...*corev1.Pod) (created, updated, deleted []string) {
	t.Helper()
	desired := Compute(Input{Resource: r, Node: node, Pods: evaluated(r, nil, pods...), Existing: p.list(), MaxEndpointsPerSlice: size})
	plan := Diff(r.Name, r.UID, node, desired, p)
	require.Empty(t, plan.Conflicts)
	for _, s := range plan.Create {
		created = append(created, s.Name)
		p[s.Name] = s
	}
	for _, s := range plan.Update {
		updated = append(updated, s.Name)
		p[s.Name] = s
	}
	for _, s := range plan.Delete {
		deleted = append(deleted, s.Name)
		delete(p, s.Name)
	}
	// Every endpoint is in exactly one slice of its family, and no slice is over the size.
	seen := map[string]string{}
	for name, s := range p {
		assert.LessOrEqual(t, len(s.Endpoints), size, "slice %s", name)
		assert.NotEmpty(t, s.Endpoints, "slice %s", name)
		for _, e := range s.Endpoints {
			if other, dup := seen[e.Addresses[0]]; dup {
				t.Errorf("endpoint %s is in %s and %s", e.Addresses[0], other, name)
			}
			seen[e.Addresses[0]] = name
		}
	}
	assert.Len(t, seen, len(pods), "every pod is published once")
	return created, updated, deleted
}

func podsNumbered(from, to int) []*corev1.Pod {
	var out []*corev1.Pod
	for i := from; i < to; i++ {
		out = append(out, pod(fmt.Sprintf("p%03d", i), 8080, fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)))
	}
	return out
}

func notReady(p *corev1.Pod) *corev1.Pod {
	p = p.DeepCopy()
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
	return p
}

// The life of a port whose endpoints outgrow one slice: it splits without rewriting the slice it
// has, a change of one endpoint writes only that endpoint's chunk, it stays split while it
// hovers above half the size, and it merges back into the common name by writing that slice
// before deleting the chunks.
func TestChunksSplitStablyAndMergeWithHysteresis(t *testing.T) {
	r := resource(webPort)
	p := published{}
	all := podsNumbered(0, 10)

	created, _, _ := p.step(t, r, 4, all[:4]...)
	assert.Equal(t, []string{"mail-web-node-a"}, created, "up to the size: one slice of the common name")

	created, updated, deleted := p.step(t, r, 4, all[:5]...)
	assert.Equal(t, []string{"mail-web---1-node-a"}, created, "the fifth endpoint opens chunk 1")
	assert.Empty(t, updated, "the full slice is not rewritten")
	assert.Empty(t, deleted)

	_, updated, _ = p.step(t, r, 4, all[:10]...)
	assert.Equal(t, []string{"mail-web---1-node-a"}, updated, "chunk 1 fills up before chunk 2 opens")
	assert.Len(t, p, 3)

	// One endpoint out: only its chunk is written.
	flipped := slices.Clone(all)
	flipped[6] = notReady(all[6])
	created, updated, deleted = p.step(t, r, 4, flipped...)
	assert.Empty(t, created)
	assert.Empty(t, deleted)
	require.Len(t, updated, 1)
	assert.Contains(t, summarize(t, []Desired{{Key: keyOf(t, p[updated[0]]), Slice: p[updated[0]]}})[updated[0]].endpoints, "10.0.0.7=FFF")

	// A pod in the middle goes: its chunk is written, no endpoint moves.
	without := slices.Delete(slices.Clone(flipped), 1, 2)
	_, updated, _ = p.step(t, r, 4, without...)
	assert.Equal(t, []string{"mail-web-node-a"}, updated)
	// A new pod fills the hole in chunk 0, the lowest chunk with room, whatever its address.
	created, updated, _ = p.step(t, r, 4, append(slices.Clone(without), podsNumbered(10, 11)...)...)
	assert.Empty(t, created)
	assert.Equal(t, []string{"mail-web-node-a"}, updated)

	// Shrunk to 3 of 4: still split while an endpoint is in a further chunk (hysteresis).
	created, _, _ = p.step(t, r, 4, all[0], all[4], all[8])
	assert.Empty(t, created)
	assert.Len(t, p, 3, "3 endpoints of 4 stay in their chunks")

	// At half the size it merges: the common name is written first, then the chunks go.
	created, updated, deleted = p.step(t, r, 4, all[0], all[8])
	assert.Empty(t, created)
	assert.Equal(t, []string{"mail-web-node-a"}, updated)
	assert.NotEmpty(t, deleted)
	assert.Equal(t, []string{"mail-web-node-a"}, slices.Sorted(maps.Keys(p)))

	// Back below the size without ever having split: no chunk.
	created, _, _ = p.step(t, r, 4, all[:4]...)
	assert.Empty(t, created)
	assert.Len(t, p, 1)
}

// An older agent's (or an earlier size's) one big slice is split by moving only what no longer
// fits, and a smaller size set later moves the overflow of each chunk, never the rest.
func TestChunksOfAnOversizedSliceMoveOnlyTheOverflow(t *testing.T) {
	r := resource(webPort)
	p := published{}
	all := podsNumbered(0, 12)
	p.step(t, r, 100, all...)
	require.Len(t, p, 1)
	before := slices.Clone(p["mail-web-node-a"].Endpoints)

	created, updated, _ := p.step(t, r, 5, all...)
	assert.Equal(t, []string{"mail-web---1-node-a", "mail-web---2-node-a"}, created)
	assert.Equal(t, []string{"mail-web-node-a"}, updated)
	assert.Equal(t, before[:5], p["mail-web-node-a"].Endpoints, "chunk 0 keeps its first endpoints")
}

// Chunks are per family and per split-port number, and their names follow slicemeta's rule.
func TestChunksOfEachFamilyAndNumber(t *testing.T) {
	r := resource(webPort)
	var pods []*corev1.Pod
	for i := range 6 {
		number := int32(8080)
		if i%2 == 1 {
			number = 9090
		}
		pods = append(pods, pod(fmt.Sprintf("p%d", i), number, fmt.Sprintf("10.0.0.%d", i+1), fmt.Sprintf("fd00::%d", i+1)))
	}
	r.Spec.IPFamilyPolicy = ptrTo(corev1.IPFamilyPolicyRequireDualStack)
	got := Compute(Input{Resource: r, Node: node, Pods: evaluated(r, nil, pods...), MaxEndpointsPerSlice: 2})
	var names []string
	for _, d := range got {
		names = append(names, d.Slice.Name)
		assert.Equal(t, d.Key.Name(), d.Slice.Name)
		assert.Equal(t, d.Key.Chunk, slicemeta.ChunkOf(d.Slice.Name, "mail", "web"))
	}
	assert.ElementsMatch(t, []string{
		"mail-web-node-a", "mail-web---1-node-a",
		"mail-web-node-a-9090", "mail-web---1-node-a-9090",
		"mail-web--node-a-ipv6", "mail-web---1--node-a-ipv6",
		"mail-web--node-a-9090-ipv6", "mail-web---1--node-a-9090-ipv6",
	}, names)
}

// A random life of pods coming, going and flipping: every endpoint is published once, no slice
// is over the size, and a flip of one pod's readiness writes exactly one slice.
func TestChunksUnderChurn(t *testing.T) {
	r := resource(webPort)
	p := published{}
	rng := rand.New(rand.NewPCG(1, 2))
	pool := podsNumbered(0, 60)
	live := map[int]*corev1.Pod{}
	current := func() []*corev1.Pod {
		var out []*corev1.Pod
		for _, i := range slices.Sorted(maps.Keys(live)) {
			out = append(out, live[i])
		}
		return out
	}
	for range 400 {
		i := rng.IntN(len(pool))
		switch pod, ok := live[i]; {
		case !ok:
			live[i] = pool[i]
		case rng.IntN(3) == 0:
			delete(live, i)
		default:
			if pod == pool[i] {
				live[i] = notReady(pool[i])
			} else {
				live[i] = pool[i]
			}
			created, updated, deleted := p.step(t, r, 7, current()...)
			assert.Equal(t, 1, len(created)+len(updated)+len(deleted), "a flip writes one slice: %v %v %v", created, updated, deleted)
			continue
		}
		p.step(t, r, 7, current()...)
	}
}

func keyOf(t *testing.T, s *discoveryv1.EndpointSlice) slicemeta.SliceKey {
	t.Helper()
	port, _ := slicemeta.PortOf(s)
	return slicemeta.SliceKey{Resource: slicemeta.ResourceOf(s), Port: port, Node: slicemeta.NodeOf(s), Chunk: slicemeta.ChunkOf(s.Name, slicemeta.ResourceOf(s), port)}
}

func ptrTo[T any](v T) *T { return &v }
