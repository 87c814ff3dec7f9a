// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
)

// chunkOf is chunk k of resource web, port http, on node n, listing the endpoints of pods
// ("name=address").
func chunkOf(k int, pods ...string) *discoveryv1.EndpointSlice {
	key := slicemeta.SliceKey{Resource: "web", Port: "http", Node: "n", Chunk: k}
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: key.Name(), Labels: key.Labels(), UID: types.UID(key.Name())}}
	for _, p := range pods {
		name, addr, _ := strings.Cut(p, "=")
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{addr},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: name, UID: types.UID("uid-" + name)}})
	}
	return s
}

func allVerified(*discoveryv1.EndpointSlice, *discoveryv1.Endpoint) bool { return true }

// judged is JudgeGroup's answer as slice name → the pods it repeats, with where.
func judged(group []*discoveryv1.EndpointSlice, verified func(*discoveryv1.EndpointSlice, *discoveryv1.Endpoint) bool) map[string][]Repeat {
	out := map[string][]Repeat{}
	for _, r := range JudgeGroup(group, verified) {
		out[r.Slice.Name] = r.Repeats
	}
	return out
}

func TestJudgeGroup(t *testing.T) {
	c0, c1, c2, c3 := chunkOf(0).Name, chunkOf(1).Name, chunkOf(2).Name, chunkOf(3).Name
	tests := map[string]struct {
		group    []*discoveryv1.EndpointSlice
		verified func(*discoveryv1.EndpointSlice, *discoveryv1.Endpoint) bool
		want     map[string][]Repeat
	}{
		"an honest agent's chunks, each endpoint in one": {
			group: []*discoveryv1.EndpointSlice{chunkOf(0, "a=10.0.0.1", "b=10.0.0.2"), chunkOf(1, "c=10.0.0.3")},
			want:  map[string][]Repeat{},
		},
		"a real endpoint repeated in a further chunk: the further chunk goes": {
			group: []*discoveryv1.EndpointSlice{chunkOf(2, "a=10.0.0.1"), chunkOf(0, "a=10.0.0.1", "b=10.0.0.2")},
			want:  map[string][]Repeat{c2: {{Address: "10.0.0.1", Pod: "a", In: c0}}},
		},
		"a few endpoints spread over more chunks than endpoints": {
			group: []*discoveryv1.EndpointSlice{
				chunkOf(0, "a=10.0.0.1"), chunkOf(1, "b=10.0.0.2"), chunkOf(2, "a=10.0.0.1", "b=10.0.0.2"), chunkOf(3, "b=10.0.0.2"),
			},
			want: map[string][]Repeat{
				c2: {{Address: "10.0.0.1", Pod: "a", In: c0}, {Address: "10.0.0.2", Pod: "b", In: c1}},
				c3: {{Address: "10.0.0.2", Pod: "b", In: c1}},
			},
		},
		"an endpoint listed twice in one slice": {
			group: []*discoveryv1.EndpointSlice{chunkOf(0, "a=10.0.0.1", "a=10.0.0.1")},
			want:  map[string][]Repeat{c0: {{Address: "10.0.0.1", Pod: "a"}}},
		},
		"a redundant slice keeps nothing: the next one is judged against the kept ones only": {
			group: []*discoveryv1.EndpointSlice{chunkOf(0, "a=10.0.0.1"), chunkOf(1, "a=10.0.0.1", "b=10.0.0.2"), chunkOf(2, "b=10.0.0.2")},
			want:  map[string][]Repeat{c1: {{Address: "10.0.0.1", Pod: "a", In: c0}}},
		},
		"a copy the audit has not verified keeps nothing": {
			group: []*discoveryv1.EndpointSlice{chunkOf(0, "a=10.0.0.1"), chunkOf(1, "a=10.0.0.1")},
			verified: func(s *discoveryv1.EndpointSlice, _ *discoveryv1.Endpoint) bool {
				return s.Name != c0
			},
			want: map[string][]Repeat{},
		},
		"another Pod at another address is no repeat": {
			group: []*discoveryv1.EndpointSlice{chunkOf(0, "a=10.0.0.1"), chunkOf(1, "b=10.0.0.1"), chunkOf(3, "a=10.0.0.9")},
			want:  map[string][]Repeat{},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			verified := tc.verified
			if verified == nil {
				verified = allVerified
			}
			assert.Equal(t, tc.want, judged(tc.group, verified))
		})
	}
}

func TestRedundancyLastsTheWindowBeforeItIsDue(t *testing.T) {
	const w = time.Second
	r := newRedundancy(w)
	t0 := time.Now()
	c0, c1 := chunkOf(0, "a=10.0.0.1"), chunkOf(1, "a=10.0.0.1")
	names := []types.NamespacedName{{Namespace: "ns", Name: c0.Name}, {Namespace: "ns", Name: c1.Name}}
	found := JudgeGroup([]*discoveryv1.EndpointSlice{c0, c1}, allVerified)

	due, wait := r.observe(names, found, t0)
	assert.Empty(t, due, "a repeat is not due at once: an agent's move lists an endpoint twice for a moment")
	assert.Equal(t, w, wait)
	due, wait = r.observe(names, found, t0.Add(w/2))
	assert.Empty(t, due)
	assert.Equal(t, w/2, wait, "the window runs from the first judgement")

	// The move completes: the group is clean, the slice forgotten; a later repeat starts again.
	due, _ = r.observe(names, nil, t0.Add(w*3/4))
	assert.Empty(t, due)
	assert.Zero(t, r.size(), "a slice judged not redundant is forgotten")
	due, _ = r.observe(names, found, t0.Add(w*3/2))
	assert.Empty(t, due, "the window starts again")
	due, wait = r.observe(names, found, t0.Add(w*5/2))
	if assert.Len(t, due, 1) {
		assert.Equal(t, c1.Name, due[0].Slice.Name, "redundant for the whole window: due")
	}
	assert.Zero(t, wait)

	// A slice re-created under the same name starts a window of its own.
	c1.UID = "recreated"
	due, _ = r.observe(names, JudgeGroup([]*discoveryv1.EndpointSlice{c0, c1}, allVerified), t0.Add(w*5/2))
	assert.Empty(t, due)
	r.forget(names[1])
	assert.Zero(t, r.size(), "a deleted slice is forgotten")
}
