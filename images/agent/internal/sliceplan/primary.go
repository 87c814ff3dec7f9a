// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package sliceplan

import (
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
)

// portFamily is one Service port in one address family: it has one primary number.
type portFamily struct {
	port   int
	family discoveryv1.AddressType
}

// primaryNumbers chooses the primary (unsuffixed) number of each (port, family) that users,
// the endpoints using each number, name (primaryNumber), keeping the one the existing slices
// publish unsuffixed.
func primaryNumbers(in Input, users map[groupKey]int) map[portFamily]int32 {
	published := publishedPrimaries(in)
	counts := map[portFamily]map[int32]int{}
	for gk, n := range users {
		k := portFamily{gk.port, gk.family}
		if counts[k] == nil {
			counts[k] = map[int32]int{}
		}
		counts[k][gk.number] = n
	}
	primary := make(map[portFamily]int32, len(counts))
	for k, byNumber := range counts {
		n, ok := published[portOf(in.Resource, k.port).Name+"/"+string(k.family)]
		primary[k] = primaryNumber(byNumber, n, ok)
	}
	return primary
}

// publishedPrimaries are the numbers of the existing unsuffixed slices, by "<port>/<family>".
func publishedPrimaries(in Input) map[string]int32 {
	primaries := map[string]int32{}
	for _, s := range in.Existing {
		port, _ := slicemeta.PortOf(s)
		// The unsuffixed slice (any chunk of it), also under the name IPv6 slices had before
		// (an upgraded agent keeps the primary number while it renames them).
		if k := (slicemeta.SliceKey{Resource: in.Resource.Name, Port: port, Node: in.Node, AddressType: s.AddressType, Chunk: slicemeta.ChunkOf(s.Name, in.Resource.Name, port)}); len(s.Ports) == 1 && s.Ports[0].Port != nil && (s.Name == k.Name() || s.Name == k.LegacyName()) {
			primaries[port+"/"+string(s.AddressType)] = *s.Ports[0].Port
		}
	}
	return primaries
}

// primaryNumber chooses the primary (unsuffixed) number of one (port, family) from byNumber,
// how many endpoints (published or waiting for their verdict) use each number: the number
// already published unsuffixed (published, when isPublished) while it is still in use, else
// the number with the most endpoints, then the smallest.
func primaryNumber(byNumber map[int32]int, published int32, isPublished bool) int32 {
	if isPublished && byNumber[published] > 0 {
		return published
	}
	best, bestCount := int32(0), -1
	for n, c := range byNumber {
		if c > bestCount || (c == bestCount && n < best) {
			best, bestCount = n, c
		}
	}
	return best
}
