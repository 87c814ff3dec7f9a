// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package sliceplan

import (
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
)

// DefaultMaxEndpointsPerSlice is how many endpoints one slice holds before the agent opens a
// further chunk (Input.MaxEndpointsPerSlice): the default of the built-in EndpointSlice
// controller (kube-controller-manager --max-endpoints-per-slice), the size kube-proxy and the
// CNIs are built for. Measured (development/BENCHMARKS.md): one write of a 1,000-endpoint slice
// costs the API server and the agent's admission policy several times one of 100 endpoints, and a
// change of one endpoint writes only its chunk.
const DefaultMaxEndpointsPerSlice = 100

// MaxOfMaxEndpointsPerSlice bounds Input.MaxEndpointsPerSlice, as the EndpointSlice API bounds
// the endpoints of one slice.
const MaxOfMaxEndpointsPerSlice = 1000

// sliceGroup is one slice: its group and its chunk (slicemeta.SliceKey.Chunk).
type sliceGroup struct {
	gk    groupKey
	chunk int
}

// placement is where an existing slice lists an endpoint: the number its port resolved to and
// the slice's chunk.
type placement struct {
	number int32
	chunk  int
}

// assignChunks returns the chunk of each candidate (cands sorted by address). A group (port,
// family, number) of at most max endpoints is one slice, the common name (chunk 0). Above max it
// is split, and an endpoint stays in the chunk that lists it while that chunk has room, so a
// change of one endpoint writes one chunk; the others fill the chunks with room from chunk 0 up,
// in address order, opening a new chunk when all are full. A split group is merged back into
// chunk 0 only when it has shrunk to max/2 endpoints (hysteresis: a group that hovers around max
// does not split and merge on every pod). Chunks that end up empty are deleted by the plan
// (Diff), after the chunk that receives their endpoints is written (the publisher deletes last).
func assignChunks(in Input, cands []candidate, parts []podParts) []int {
	out := make([]int, len(cands))
	limit := in.MaxEndpointsPerSlice
	if limit <= 0 {
		limit = DefaultMaxEndpointsPerSlice
	}
	size := map[groupKey]int{}
	for _, c := range cands {
		size[c.gk]++
	}
	var placed map[carryKey]placement
	split := map[groupKey]bool{}
	for gk, n := range size {
		if n <= limit/2 {
			continue
		}
		if placed == nil {
			placed = placements(in)
		}
		split[gk] = n > limit
	}
	if placed == nil {
		return out
	}
	// A group between max/2 and max stays split while an endpoint is still in a further chunk.
	key := func(c candidate) carryKey {
		return carryKey{portOf(in.Resource, c.gk.port).Name, in.Pods[c.pod].Pod.UID, parts[c.pod].addresses[c.ip][0]}
	}
	keys := make([]carryKey, len(cands))
	for i, c := range cands {
		if _, ok := split[c.gk]; !ok {
			continue
		}
		keys[i] = key(c)
		if p, ok := placed[keys[i]]; ok && p.number == c.gk.number && p.chunk > 0 {
			split[c.gk] = true
		}
	}
	used := map[sliceGroup]int{}
	unplaced := make([]int, 0, len(cands))
	for i, c := range cands {
		if !split[c.gk] {
			continue
		}
		p, ok := placed[keys[i]]
		if !ok || p.number != c.gk.number || used[sliceGroup{c.gk, p.chunk}] >= limit {
			unplaced = append(unplaced, i)
			continue
		}
		out[i] = p.chunk
		used[sliceGroup{c.gk, p.chunk}]++
	}
	next := map[groupKey]int{}
	for _, i := range unplaced {
		gk := cands[i].gk
		for used[sliceGroup{gk, next[gk]}] >= limit {
			next[gk]++
		}
		out[i] = next[gk]
		used[sliceGroup{gk, next[gk]}]++
	}
	return out
}

// placements indexes the chunk of each endpoint of the existing slices by port, pod and
// address. A slice whose name is not the chunk its name says (slicemeta.ChunkOf) counts as chunk
// 0: the common name, an older agent's name, or one the agent does not know.
func placements(in Input) map[carryKey]placement {
	n := 0
	for _, s := range in.Existing {
		n += len(s.Endpoints)
	}
	out := make(map[carryKey]placement, n)
	for _, s := range in.Existing {
		var number int32
		switch {
		case len(s.Ports) == 1 && s.Ports[0].Port != nil:
			number = *s.Ports[0].Port
		case len(s.Ports) != 0:
			continue // not a slice the agent writes
		}
		port, _ := slicemeta.PortOf(s)
		chunk := existingChunk(in, s, port, number)
		for _, e := range s.Endpoints {
			if e.TargetRef == nil || len(e.Addresses) == 0 {
				continue
			}
			out[carryKey{port, e.TargetRef.UID, e.Addresses[0]}] = placement{number: number, chunk: chunk}
		}
	}
	return out
}

// existingChunk is the chunk of an existing slice of the port: the one its name carries when
// the name is that chunk's (with or without its number as a split port's), else 0.
func existingChunk(in Input, s *discoveryv1.EndpointSlice, port string, number int32) int {
	chunk := slicemeta.ChunkOf(s.Name, in.Resource.Name, port)
	if chunk == 0 {
		return 0
	}
	k := slicemeta.SliceKey{Resource: in.Resource.Name, Port: port, Node: in.Node, Chunk: chunk}
	if s.AddressType == discoveryv1.AddressTypeIPv6 {
		k.AddressType = discoveryv1.AddressTypeIPv6
	}
	if s.Name == k.Name() {
		return chunk
	}
	k.SplitPort = number
	if number != 0 && s.Name == k.Name() {
		return chunk
	}
	return 0
}
