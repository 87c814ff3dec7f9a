// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package slicemeta

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

func TestSliceName(t *testing.T) {
	long := strings.Repeat("n", 250)
	tests := map[string]struct {
		key  SliceKey
		want string
	}{
		"a named port is resource-port-node": {
			key:  SliceKey{Resource: "db", Port: "postgres", Node: "worker-1"},
			want: "db-postgres-worker-1",
		},
		"a single unnamed port is resource-node": {
			key:  SliceKey{Resource: "web", Node: "worker-1"},
			want: "web-worker-1",
		},
		"a split port carries its number": {
			key:  SliceKey{Resource: "web", Port: "http", Node: "worker-1", SplitPort: 8081},
			want: "web-http-worker-1-8081",
		},
		"an IPv6 slice has a double dash before the node and ends in -ipv6": {
			key:  SliceKey{Resource: "web", Port: "http", Node: "worker-1", AddressType: discoveryv1.AddressTypeIPv6},
			want: "web-http--worker-1-ipv6",
		},
		"an IPv6 slice of a single unnamed port has the double dash after the resource": {
			key:  SliceKey{Resource: "web", Node: "worker-1", AddressType: discoveryv1.AddressTypeIPv6},
			want: "web--worker-1-ipv6",
		},
		"the IPv4 slice of a node named like an IPv6 slice keeps the single dash": {
			key:  SliceKey{Resource: "web", Port: "http", Node: "worker-1-ipv6"},
			want: "web-http-worker-1-ipv6",
		},
		"an explicit IPv4 slice has no suffix": {
			key:  SliceKey{Resource: "web", Port: "http", Node: "worker-1", AddressType: discoveryv1.AddressTypeIPv4},
			want: "web-http-worker-1",
		},
		"a node name that does not fit is replaced by its digest": {
			key:  SliceKey{Resource: "web", Port: "http", Node: long},
			want: "web-http-" + wellknown.NodeDigest(long),
		},
		"a long node with split port and IPv6 keeps both suffixes": {
			key:  SliceKey{Resource: "web", Port: "http", Node: long, SplitPort: 9, AddressType: discoveryv1.AddressTypeIPv6},
			want: "web-http--" + wellknown.NodeDigest(long) + "-9-ipv6",
		},
		"an IPv6 split port carries its number before -ipv6": {
			key:  SliceKey{Resource: "web", Port: "http", Node: "worker-1", SplitPort: 8081, AddressType: discoveryv1.AddressTypeIPv6},
			want: "web-http--worker-1-8081-ipv6",
		},
		"a further chunk has a double dash and its number before the node": {
			key:  SliceKey{Resource: "web", Port: "http", Node: "worker-1", Chunk: 2},
			want: "web-http---2-worker-1",
		},
		"an IPv6 chunk of a split port has both markers and both suffixes": {
			key:  SliceKey{Resource: "web", Port: "http", Node: "worker-1", SplitPort: 8081, Chunk: 12, AddressType: discoveryv1.AddressTypeIPv6},
			want: "web-http---12--worker-1-8081-ipv6",
		},
		"a chunk of a single unnamed port has the marker after the resource": {
			key:  SliceKey{Resource: "web", Node: "worker-1", Chunk: 1},
			want: "web---1-worker-1",
		},
		"a long node of a chunk is replaced by its digest": {
			key:  SliceKey{Resource: "web", Port: "http", Node: long, Chunk: 3},
			want: "web-http---3-" + wellknown.NodeDigest(long),
		},
		"a node name that just fits an IPv4 name is kept there": {
			key:  SliceKey{Resource: "web", Port: "http", Node: strings.Repeat("n", 253-len("web-http-"))},
			want: "web-http-" + strings.Repeat("n", 253-len("web-http-")),
		},
		"the same node name is replaced by its digest in the longer IPv6 name": {
			key:  SliceKey{Resource: "web", Port: "http", Node: strings.Repeat("n", 253-len("web-http-")), AddressType: discoveryv1.AddressTypeIPv6},
			want: "web-http--" + wellknown.NodeDigest(strings.Repeat("n", 253-len("web-http-"))) + "-ipv6",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := tc.key.Name()
			assert.Equal(t, tc.want, got)
			assert.LessOrEqual(t, len(got), wellknown.MaxNameLength)
			assert.Empty(t, validation.IsDNS1123Subdomain(got), "slice name must be a valid object name")
		})
	}
}

// The families' names never meet: for every pair of node names, the IPv4 slice of one and the
// IPv6 slice of the other (with or without split ports) differ. The node names are the ones a
// suffix or prefix rule would confuse: a node named like another's IPv6 slice, nodes whose
// names start or end with "ipv6", nodes with dots and double dashes.
func TestSliceNamesOfTheTwoFamiliesNeverCollide(t *testing.T) {
	for _, port := range []string{"", "http", "a-b"} {
		for _, split := range []int32{0, 8081} {
			seen := map[string]SliceKey{}
			// A node named like another's digest shares its names by design (wellknown.NodeDigest).
			for _, node := range append(trickyNodes, wellknown.NodeDigest(strings.Repeat("z", 250))) {
				for _, family := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
					k := SliceKey{Resource: "web", Port: port, Node: node, SplitPort: split, AddressType: family}
					name := k.Name()
					if other, dup := seen[name]; dup && other.AddressType != family {
						t.Errorf("%+v and %+v share the name %q", other, k, name)
					}
					seen[name] = k
				}
			}
		}
	}
	// The old rule had exactly the collision the issue names.
	assert.Equal(t,
		SliceKey{Resource: "web", Port: "http", Node: "x-ipv6"}.LegacyName(),
		SliceKey{Resource: "web", Port: "http", Node: "x", AddressType: discoveryv1.AddressTypeIPv6}.LegacyName(),
		"the old rule named the IPv4 slice of node x-ipv6 and the IPv6 slice of node x alike")
}

// trickyNodes are node names a suffix or prefix rule would confuse: named like another node's
// IPv6 slice, split port or chunk, starting or ending with "ipv6" or a number, with dots and
// double dashes, and names only their digest fits.
var trickyNodes = []string{
	"x", "x-ipv6", "x-ipv6-ipv6", "ipv6", "ipv6-x", "x--y", "x--y-ipv6", "x.ipv6", "x-8081", "x-8081-ipv6",
	"8081-x", "x.y-ipv6", "2-x", "x-2", "x--2", "2--x", "1-x-ipv6", "x-8081-2",
	strings.Repeat("z", 250), strings.Repeat("z", 245) + "-ipv6",
}

// No two keys of one resource in different chunks or families share a name, whatever the node
// names (a chunk's "-<number>" after the node would have been a node "x-2"'s common name, and
// its number right after the port's dash a node "2-x"'s). And ChunkOf reads back the chunk of
// every name.
func TestSliceNamesOfChunksNeverCollide(t *testing.T) {
	for _, port := range []string{"", "http", "a-b"} {
		seen := map[string]SliceKey{}
		for _, node := range trickyNodes {
			for _, split := range []int32{0, 2, 8081} {
				for _, chunk := range []int{0, 1, 2, 12} {
					for _, family := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
						k := SliceKey{Resource: "web", Port: port, Node: node, SplitPort: split, Chunk: chunk, AddressType: family}
						name := k.Name()
						// A split port's "-<number>" after the node is a node "x-<number>"'s
						// common name (development/AGENT.md): the agent reports that name as
						// held; chunks add no such pair.
						if other, dup := seen[name]; dup && (other.Chunk != chunk || other.AddressType != family) {
							t.Errorf("%+v and %+v share the name %q", other, k, name)
						}
						seen[name] = k
						assert.Equal(t, chunk, ChunkOf(name, "web", port), name)
						assert.Empty(t, validation.IsDNS1123Subdomain(name), name)
					}
				}
			}
		}
	}
	assert.Zero(t, ChunkOf("web-http---0-x", "web", "http"), "chunk numbers start at 1")
	assert.Zero(t, ChunkOf("web-http---02-x", "web", "http"), "a number with a leading zero is no chunk's")
	assert.Zero(t, ChunkOf("web-http---2", "web", "http"), "a chunk's number is followed by a dash and the node")
	assert.Zero(t, ChunkOf("web-http---2-x", "web", "other"), "another port's name")
}

func TestLegacyName(t *testing.T) {
	long := strings.Repeat("n", 250)
	tests := map[string]struct {
		key  SliceKey
		want string
	}{
		"an IPv4 slice keeps its name":                 {key: SliceKey{Resource: "web", Port: "http", Node: "w1"}, want: "web-http-w1"},
		"an IPv6 slice had the -ipv6 suffix only":      {key: SliceKey{Resource: "web", Port: "http", Node: "w1", AddressType: discoveryv1.AddressTypeIPv6}, want: "web-http-w1-ipv6"},
		"an IPv6 split port had its number before it":  {key: SliceKey{Resource: "web", Port: "http", Node: "w1", SplitPort: 9, AddressType: discoveryv1.AddressTypeIPv6}, want: "web-http-w1-9-ipv6"},
		"a long node name of an IPv6 slice was hashed": {key: SliceKey{Resource: "web", Port: "http", Node: long, AddressType: discoveryv1.AddressTypeIPv6}, want: "web-http-" + wellknown.NodeDigest(long) + "-ipv6"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.key.LegacyName())
		})
	}
}

func TestSliceNameOfTheLongestInputsIsValid(t *testing.T) {
	k := SliceKey{
		Resource:    strings.Repeat("r", 63),
		Port:        strings.Repeat("p", 63),
		Node:        strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61),
		SplitPort:   65535,
		AddressType: discoveryv1.AddressTypeIPv6,
	}
	name := k.Name()
	assert.LessOrEqual(t, len(name), wellknown.MaxNameLength)
	assert.Empty(t, validation.IsDNS1123Subdomain(name))
	assert.Equal(t, name, k.Name(), "the name is stable")
}

func TestLabels(t *testing.T) {
	tests := map[string]struct {
		key      SliceKey
		wantNode bool
	}{
		"a short node name is a label":            {key: SliceKey{Resource: "db", Port: "pg", Node: "worker-1"}, wantNode: true},
		"a node name over 63 characters is not":   {key: SliceKey{Resource: "db", Port: "pg", Node: strings.Repeat("n", 64)}, wantNode: false},
		"a single unnamed port has an empty port": {key: SliceKey{Resource: "db", Node: "w"}, wantNode: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			l := tc.key.Labels()
			assert.Equal(t, tc.key.Resource, l[discoveryv1.LabelServiceName])
			assert.Equal(t, wellknown.ManagedBy, l[discoveryv1.LabelManagedBy])
			assert.Equal(t, tc.key.Resource, l[wellknown.LabelResource])
			assert.Equal(t, tc.key.Port, l[wellknown.LabelPort])
			_, has := l[wellknown.LabelNode]
			assert.Equal(t, tc.wantNode, has)
			assert.Equal(t, NodeKey(tc.key.Node), l[wellknown.LabelNodeKey], "the node key label is always there")
			if tc.wantNode {
				assert.Equal(t, tc.key.Node, l[wellknown.LabelNodeKey], "a name that fits is its own key")
			} else {
				assert.Equal(t, "digest-"+wellknown.NodeDigest(tc.key.Node), l[wellknown.LabelNodeKey])
			}
			for k, v := range l {
				assert.Empty(t, validation.IsQualifiedName(k), "label key %q", k)
				assert.Empty(t, validation.IsValidLabelValue(v), "label value %q", v)
			}
			assert.Equal(t, tc.key.Node, tc.key.Annotations()[wellknown.AnnotationNode])
		})
	}
}

func TestOwnership(t *testing.T) {
	key := SliceKey{Resource: "db", Port: "pg", Node: "w1"}
	slice := func(managedBy string, uid string) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Name:        key.Name(),
				Labels:      key.Labels(),
				Annotations: key.Annotations(),
			},
			AddressType: discoveryv1.AddressTypeIPv4,
		}
		s.Labels[discoveryv1.LabelManagedBy] = managedBy
		if uid != "" {
			s.OwnerReferences = []metav1.OwnerReference{OwnerReference("db", typesUID("uid-"+uid))}
		}
		return s
	}
	tests := map[string]struct {
		slice *discoveryv1.EndpointSlice
		uid   string
		want  bool
	}{
		"ours and owned by the live resource":       {slice: slice(wellknown.ManagedBy, "a"), uid: "uid-a", want: true},
		"ours but owned by a deleted resource":      {slice: slice(wellknown.ManagedBy, "old"), uid: "uid-a", want: false},
		"another controller's slice with our owner": {slice: slice("endpointslice-controller.k8s.io", "a"), uid: "uid-a", want: false},
		"ours without an owner reference":           {slice: slice(wellknown.ManagedBy, ""), uid: "uid-a", want: false},
		"no live resource never owns anything":      {slice: slice(wellknown.ManagedBy, ""), uid: "", want: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, IsOwnedBy(tc.slice, typesUID(tc.uid)))
		})
	}
	assert.True(t, key.Matches(slice(wellknown.ManagedBy, "a")))
	assert.False(t, SliceKey{Resource: "db", Port: "pg", Node: "w2"}.Matches(slice(wellknown.ManagedBy, "a")))
	assert.Equal(t, "w1", NodeOf(slice(wellknown.ManagedBy, "a")))
}

func TestPrefixCollision(t *testing.T) {
	// "a-b" with port "c" and "a" with port "b-c" publish the same names on every node.
	assert.Equal(t, Prefix("a-b", "c"), Prefix("a", "b-c"))
	assert.Equal(t, SliceKey{Resource: "a-b", Port: "c", Node: "n"}.Name(), SliceKey{Resource: "a", Port: "b-c", Node: "n"}.Name())
	assert.NotEqual(t, Prefix("a", "b"), Prefix("a", "c"))
}

func typesUID(s string) types.UID { return types.UID(s) }

func TestResourceAndPortOfASlice(t *testing.T) {
	labelled := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{
		Labels:          SliceKey{Resource: "db", Port: "pg", Node: "w1"}.Labels(),
		OwnerReferences: []metav1.OwnerReference{OwnerReference("other", "uid")},
	}}
	ownerOnly := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{
		OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "v1", Kind: "Service", Name: "svc"},
			OwnerReference("db", "uid"),
		},
	}}
	foreignKind := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "example.com/v1", Kind: wellknown.Kind, Name: "db"}},
	}}
	cases := map[string]struct {
		slice    *discoveryv1.EndpointSlice
		resource string
		port     string
		hasPort  bool
	}{
		"the resource label wins over the owner reference":       {labelled, "db", "pg", true},
		"without labels the owner reference names it":            {ownerOnly, "db", "", false},
		"a kind of the same name from another group is not ours": {foreignKind, "", "", false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.resource, ResourceOf(tc.slice))
			port, ok := PortOf(tc.slice)
			assert.Equal(t, tc.port, port)
			assert.Equal(t, tc.hasPort, ok)
		})
	}
	unnamed := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Labels: SliceKey{Resource: "db", Node: "w1"}.Labels()}}
	port, ok := PortOf(unnamed)
	assert.True(t, ok, "a single unnamed port has an empty port label, not none")
	assert.Empty(t, port)
}

// TestSquatNamesAreNotTheirNodes: a slice published for one node under a name another node's
// agent publishes (its common name, a chunk, an IPv6 slice, a split port's, the digest of a
// long node name) is not its node's; the honest agent's own names are.
func TestSquatNamesAreNotTheirNodes(t *testing.T) {
	long := strings.Repeat("l", 250)
	otherLong := strings.Repeat("m", 250)
	slice := func(k SliceKey, name string) *discoveryv1.EndpointSlice {
		at := k.AddressType
		if at == "" {
			at = discoveryv1.AddressTypeIPv4
		}
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: k.Labels(), Annotations: k.Annotations()},
			AddressType: at,
		}
		if k.Port != "" || k.SplitPort != 0 {
			number := int32(8080)
			if k.SplitPort != 0 {
				number = k.SplitPort
			}
			s.Ports = []discoveryv1.EndpointPort{{Name: &k.Port, Port: &number}}
		}
		return s
	}
	own := func(k SliceKey) *discoveryv1.EndpointSlice { return slice(k, k.Name()) }
	// as is the slice of k under the name of other.
	as := func(k, other SliceKey) *discoveryv1.EndpointSlice { return slice(k, other.Name()) }
	web := SliceKey{Resource: "web", Port: "http", Node: "node-a"}
	with := func(k SliceKey, f func(*SliceKey)) SliceKey { f(&k); return k }
	onB := func(k *SliceKey) { k.Node = "node-b" }
	v6 := func(k *SliceKey) { k.AddressType = discoveryv1.AddressTypeIPv6 }
	chunk3 := func(k *SliceKey) { k.Chunk = 3 }
	split := func(k *SliceKey) { k.SplitPort = 8081 }
	longNode := func(k *SliceKey) { k.Node = long }
	otherLongNode := func(k *SliceKey) { k.Node = otherLong }
	legacy := with(web, v6)

	tests := map[string]struct {
		slice *discoveryv1.EndpointSlice
		own   bool
	}{
		"its common name":                        {slice: own(web), own: true},
		"a single unnamed port":                  {slice: own(SliceKey{Resource: "web", Node: "node-a"}), own: true},
		"its chunk":                              {slice: own(with(web, chunk3)), own: true},
		"its IPv6 slice":                         {slice: own(with(web, v6)), own: true},
		"its IPv6 chunk of a split port":         {slice: own(with(with(with(web, v6), chunk3), split)), own: true},
		"its split port":                         {slice: own(with(web, split)), own: true},
		"the digest of its long name":            {slice: own(with(web, longNode)), own: true},
		"a chunk of the digest of its long name": {slice: own(with(with(web, longNode), chunk3)), own: true},
		"its IPv6 slice's name before issue 20":  {slice: slice(legacy, legacy.LegacyName()), own: true},
		"node-b's common name":                   {slice: as(web, with(web, onB))},
		"node-b's single unnamed port":           {slice: as(SliceKey{Resource: "web", Node: "node-a"}, SliceKey{Resource: "web", Node: "node-b"})},
		"node-b's chunk":                         {slice: as(with(web, chunk3), with(with(web, onB), chunk3))},
		"node-b's IPv6 slice":                    {slice: as(with(web, v6), with(with(web, v6), onB))},
		"node-b's split port":                    {slice: as(with(web, split), with(with(web, split), onB))},
		"another number than its port's":         {slice: as(web, with(web, func(k *SliceKey) { k.SplitPort = 9999 }))},
		"the digest of another long node":        {slice: as(with(web, longNode), with(web, otherLongNode))},
		"a digest where its name fits":           {slice: slice(web, "web-http-"+wellknown.NodeDigest("node-a"))},
		"another port's name":                    {slice: as(web, with(web, func(k *SliceKey) { k.Port = "metrics" }))},
		"chunk zero":                             {slice: slice(web, "web-http---0-node-a")},
		"a name that is no slice's":              {slice: slice(web, "web-http-node-a-extra")},
		"the IPv4 name for an IPv6 slice":        {slice: as(with(web, v6), web)},
		"without the node annotation": {slice: func() *discoveryv1.EndpointSlice {
			s := own(web)
			s.Annotations = nil
			delete(s.Labels, wellknown.LabelNode)
			return s
		}()},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.own, NameIsItsNodes(tc.slice), "%s", tc.slice.Name)
		})
	}
}
