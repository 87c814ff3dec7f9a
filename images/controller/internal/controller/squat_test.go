// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/gc"
)

// TestSquatSlicesAreDeletedWithAnEventAndTheHonestOnesKept: slices a node published under
// names of another node's slices (its common name, a chunk, and the digest of another long
// node name, which the agents' admission policy cannot compute) are deleted with an Event that
// names the node that published them, counted as gc.NameNotItsNode. Positive control: the
// honest agents' own slices (common, chunk, IPv6, split port, a long node name's digest and its
// chunk, the IPv6 name before issue 20) are kept.
func TestSquatSlicesAreDeletedWithAnEventAndTheHonestOnesKept(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "squat")
	run := startController(t, ns, nil)
	swh := newResource(ns, "web", nil)
	create(t, swh)
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.NotEmpty(c, swh.Status.Conditions)
	}, "the resource is reconciled")

	a, b := ns+"-a", ns+"-b"
	// Two node names longer than a slice name leaves room for: their slices carry digests.
	longA := strings.Join([]string{strings.Repeat("l", 63), strings.Repeat("a", 63), strings.Repeat("n", 63), strings.Repeat("s", 58)}, ".")
	longB := strings.Join([]string{strings.Repeat("l", 63), strings.Repeat("b", 63), strings.Repeat("n", 63), strings.Repeat("s", 58)}, ".")
	for _, n := range []string{a, b, longA, longB} {
		node(t, n)
	}
	key := func(node string, f ...func(*slicemeta.SliceKey)) slicemeta.SliceKey {
		k := slicemeta.SliceKey{Resource: "web", Port: "http", Node: node}
		for _, o := range f {
			o(&k)
		}
		return k
	}
	chunk := func(k *slicemeta.SliceKey) { k.Chunk = 2 }
	v6 := func(k *slicemeta.SliceKey) { k.AddressType = discoveryv1.AddressTypeIPv6 }
	split := func(k *slicemeta.SliceKey) { k.SplitPort = 8081 }
	// as publishes the slice of k (its labels, annotation and endpoint) under name.
	as := func(k slicemeta.SliceKey, name string) *discoveryv1.EndpointSlice {
		return slice(t, ns, "web", swh.UID, k.Port, k.Node, named(name), func(s *discoveryv1.EndpointSlice) {
			if k.AddressType == discoveryv1.AddressTypeIPv6 {
				s.AddressType = discoveryv1.AddressTypeIPv6
				s.Endpoints[0].Addresses = []string{"fd00::5"}
			}
			if k.SplitPort != 0 {
				s.Ports[0].Port = ptr.To(k.SplitPort)
			}
		})
	}
	own := func(k slicemeta.SliceKey) *discoveryv1.EndpointSlice { return as(k, k.Name()) }

	honest := []*discoveryv1.EndpointSlice{
		own(key(a)), own(key(a, chunk)), own(key(a, v6)), own(key(a, split)), own(key(a, v6, chunk, split)),
		own(key(longA)), own(key(longA, chunk)),
		as(key(a, v6), key(a, v6).LegacyName()),
	}
	written := time.Now()
	squatters := map[string]*discoveryv1.EndpointSlice{
		a:     as(key(a), key(b).Name()),
		b:     as(key(b, chunk), key(a, func(k *slicemeta.SliceKey) { k.Chunk = 3 }).Name()),
		longA: as(key(longA), key(longB).Name()),
	}
	require.Contains(t, squatters[longA].Name, wellknown.NodeDigest(longB), "the digest squatter holds longB's digest name")

	for node, s := range squatters {
		gone(t, s, "the squatter of node "+node+" is deleted")
	}
	// A figure for docs/SECURITY.md, not a bound: from the squatters' writes to the last one gone.
	t.Logf("the %d squatters were deleted within %s of their writes", len(squatters), time.Since(written).Round(time.Millisecond))
	for node, s := range squatters {
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			var notes []string
			for _, e := range eventsAbout(t, ns, "web", EventSliceNameSquatted) {
				notes = append(notes, e.Note)
			}
			assert.Contains(c, strings.Join(notes, "\n"), "Deleted EndpointSlice "+s.Name+" published for node \""+node+"\"")
		}, wait, tick, "an Event names the node of %s", s.Name)
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, float64(len(squatters)), testutil.ToFloat64(run.metrics.GarbageCollectedSlices.WithLabelValues(string(gc.NameNotItsNode))))
	}, wait, tick, "each squatter is counted")
	for _, s := range honest {
		assert.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(s), s), "the honest slice %s is kept", s.Name)
	}
}

// chunkNamed names a slice of resource web as further chunk k of its port on nodeName: a name
// the node's agent may take (a slice under another name is a squatter, gc.NameNotItsNode), for
// tests that write several slices of one port and node.
func chunkNamed(port, nodeName string, k int) sliceOpt {
	return named(slicemeta.SliceKey{Resource: "web", Port: port, Node: nodeName, Chunk: k}.Name())
}
