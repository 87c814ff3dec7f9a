// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package slicemeta holds what the controller and the agent must agree on about the
// EndpointSlices this module manages: how they are named, which labels and annotations they
// carry (the names themselves are package wellknown's) and which resource owns them.
// Everything here is a pure function of plain values.
package slicemeta

import (
	"strconv"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

const (
	// ipv6Marker comes between the port and the node in the name of an IPv6 slice: the extra
	// dash can never follow the port in an IPv4 name, where a node name (which starts with a
	// letter or digit) or its digest does.
	ipv6Marker = "-"
	// ipv6Suffix ends the name of an IPv6 slice, for the reader; the marker is what keeps the
	// names of the two families apart.
	ipv6Suffix = "-ipv6"
	// chunkMarker comes after the port's dash in the name of a further chunk (SliceKey.Chunk),
	// before the chunk's number and a dash: "--" can follow the port's dash in no other name,
	// where a node name or its digest (a letter or digit) or the IPv6 marker and then a node
	// name follow it.
	chunkMarker = "--"
)

// SliceKey identifies one EndpointSlice of a resource.
type SliceKey struct {
	// Resource is the name of the ServiceWithHealthchecks (and of its Service).
	Resource string
	// Port is the name of the Service port; empty for a resource with a single unnamed port.
	Port string
	// Node is the full node name.
	Node string
	// SplitPort is non-zero when pods on one node resolve a named target port to different
	// numbers: every number but the primary one gets its own slice, suffixed with it.
	SplitPort int32
	// AddressType is IPv4 (the default when empty) or IPv6.
	AddressType discoveryv1.AddressType
	// Chunk is non-zero for the further slices of a (resource, port, node, family, number)
	// whose endpoints are more than one slice holds (the agent's --max-endpoints-per-slice):
	// chunk 0 is the slice of the common name, chunks 1, 2, … have ChunkMarker and their
	// number before the node (Name).
	Chunk int
}

// Prefix is the part of every slice name of (resource, port) that comes before the node.
// Two live (resource, port) pairs with the same prefix collide on every node.
func Prefix(resource, port string) string {
	if port == "" {
		return resource + "-"
	}
	return resource + "-" + port + "-"
}

// Name is the name of the slice: <resource>-<port>-<node>, or <resource>-<node> for a single
// unnamed port, then -<number> for a split port. An IPv6 slice has a second dash before the node
// and ends in -ipv6: <resource>-<port>--<node>-ipv6 (<resource>--<node>-ipv6). When the name is
// longer than an object name may be, the node name is replaced by its digest.
//
// The double dash keeps the families apart: in an IPv4 name a node name, which starts with a
// letter or digit, follows the port's dash, so no IPv4 slice of a (resource, port) can have the
// name of an IPv6 one, whatever the node names (a suffix alone could not: the IPv4 slice of a
// node "x-ipv6" would be the IPv6 slice of node "x"). Both families start with
// Prefix(resource, port), so every slice of a resource is found by that prefix, and two
// resources' names collide on every node exactly when their prefixes are equal, as before.
// IPv6 slices were named <resource>-<port>-<node>-ipv6 until this rule (LegacyName).
//
// A further chunk (Chunk > 0) has the chunk marker, its number and a dash after the prefix:
// <resource>-<port>---<chunk>-<node>, <resource>-<port>---<chunk>--<node>-ipv6. After the
// prefix no other name of (resource, port) continues with "--", and the chunk's number ends at
// the first dash, so chunks meet neither the common names of any node nor each other. (Names of
// different resources can meet where a resource name has a double dash, as IPv6 names already
// could: "r-p---2" with an unnamed port on node "w" and chunk 2 of "r", port "p", on node "w".
// The agent reports such a name as held by someone else and the status check of equal
// prefixes does not see it.)
func (k SliceKey) Name() string {
	suffix := ""
	if k.SplitPort != 0 {
		suffix += "-" + strconv.Itoa(int(k.SplitPort))
	}
	prefix := Prefix(k.Resource, k.Port)
	if k.Chunk > 0 {
		prefix += chunkMarker + strconv.Itoa(k.Chunk) + "-"
	}
	if k.AddressType == discoveryv1.AddressTypeIPv6 {
		prefix += ipv6Marker
		suffix += ipv6Suffix
	}
	if len(prefix)+len(k.Node)+len(suffix) <= wellknown.MaxNameLength {
		return prefix + k.Node + suffix
	}
	return prefix + wellknown.NodeDigest(k.Node) + suffix
}

// ChunkOf is the chunk number the name of a slice of (resource, port) carries: the number
// after Prefix(resource, port) and the chunk marker, 0 for a name without it. It reads the name
// only; a caller that must know the slice is a chunk of a key compares the name with the key's
// Name with that Chunk.
func ChunkOf(name, resource, port string) int {
	rest, ok := strings.CutPrefix(name, Prefix(resource, port)+chunkMarker)
	if !ok {
		return 0
	}
	digits, _, ok := strings.Cut(rest, "-")
	if !ok || digits == "" || len(digits) > 6 || digits[0] == '0' {
		return 0
	}
	n, err := strconv.Atoi(digits)
	if err != nil {
		return 0
	}
	return n
}

// NameIsItsNodes tells whether the slice's name is one the agent of the node it is published
// for (NodeOf) gives a slice of its resource (ResourceOf), port (PortOf), family and port
// number: Name with any chunk and, for a split port, its number (the port's) or none, or an IPv6
// slice's LegacyName (an upgraded agent renames those itself). A slice of this module whose
// name is not its node's holds a name another node's agent would publish (squatting, issue 40):
// the agents' admission policy refuses the names it can compute (CEL has no hash, so the
// digest of a long node name is the controller's to check with this function).
func NameIsItsNodes(s *discoveryv1.EndpointSlice) bool {
	node := NodeOf(s)
	resource := ResourceOf(s)
	if node == "" || resource == "" {
		return false
	}
	port, _ := PortOf(s)
	k := SliceKey{Resource: resource, Port: port, Node: node, AddressType: s.AddressType, Chunk: ChunkOf(s.Name, resource, port)}
	numbers := []int32{0}
	if len(s.Ports) > 0 && s.Ports[0].Port != nil && *s.Ports[0].Port != 0 {
		numbers = append(numbers, *s.Ports[0].Port)
	}
	for _, n := range numbers {
		k.SplitPort = n
		if s.Name == k.Name() || s.Name == k.LegacyName() {
			return true
		}
	}
	return false
}

// LegacyName is the name the slice had before the IPv6 marker (Name): the same as Name for an
// IPv4 slice, <resource>-<port>-<node>[-<number>]-ipv6 for an IPv6 one. An agent upgraded
// from a version that named IPv6 slices so finds them by their labels and annotation (they are
// its own slices of the same resource, port and node), publishes the new name and deletes the
// old one; LegacyName only lets it recognise an old unsuffixed slice as the primary of a split
// port. A chunk never had another name.
func (k SliceKey) LegacyName() string {
	if k.AddressType != discoveryv1.AddressTypeIPv6 || k.Chunk > 0 {
		return k.Name()
	}
	suffix := ""
	if k.SplitPort != 0 {
		suffix += "-" + strconv.Itoa(int(k.SplitPort))
	}
	suffix += ipv6Suffix
	prefix := Prefix(k.Resource, k.Port)
	if len(prefix)+len(k.Node)+len(suffix) <= wellknown.MaxNameLength {
		return prefix + k.Node + suffix
	}
	return prefix + wellknown.NodeDigest(k.Node) + suffix
}

// NodeKey is the value of the wellknown.LabelNodeKey label for a node: its name when that is a
// valid label value, else "digest-" and its wellknown.NodeDigest (a name is at most 63
// characters there, a digest 23).
func NodeKey(node string) string {
	if len(validation.IsValidLabelValue(node)) == 0 {
		return node
	}
	return "digest-" + wellknown.NodeDigest(node)
}

// Labels are the labels of the slice. The node label is left out when the node name is not a
// valid label value (longer than 63 characters); the node key label and the node annotation
// are always there.
func (k SliceKey) Labels() map[string]string {
	l := map[string]string{
		discoveryv1.LabelServiceName: k.Resource,
		discoveryv1.LabelManagedBy:   wellknown.ManagedBy,
		wellknown.LabelResource:      k.Resource,
		wellknown.LabelPort:          k.Port,
		wellknown.LabelNodeKey:       NodeKey(k.Node),
	}
	if len(validation.IsValidLabelValue(k.Node)) == 0 {
		l[wellknown.LabelNode] = k.Node
	}
	return l
}

// Annotations are the annotations of the slice.
func (k SliceKey) Annotations() map[string]string {
	return map[string]string{wellknown.AnnotationNode: k.Node}
}

// IsManaged tells whether a slice carries this module's managed-by label.
func IsManaged(s *discoveryv1.EndpointSlice) bool {
	return s.Labels[discoveryv1.LabelManagedBy] == wellknown.ManagedBy
}

// IsResourceRef tells whether an owner reference names a ServiceWithHealthchecks (of any
// version of the group). It is the one test of "our owner reference", for slices and Services.
func IsResourceRef(ref metav1.OwnerReference) bool {
	return ref.Kind == wellknown.Kind && strings.HasPrefix(ref.APIVersion, wellknown.Group+"/")
}

// ResourceRef is the first owner reference that names a ServiceWithHealthchecks.
func ResourceRef(refs []metav1.OwnerReference) (metav1.OwnerReference, bool) {
	for _, ref := range refs {
		if IsResourceRef(ref) {
			return ref, true
		}
	}
	return metav1.OwnerReference{}, false
}

// OwnerUID is the UID of the ServiceWithHealthchecks that a managed slice names as its owner,
// or "" when it names none.
func OwnerUID(s *discoveryv1.EndpointSlice) types.UID {
	ref, _ := ResourceRef(s.OwnerReferences)
	return ref.UID
}

// ResourceOf is the name of the resource a slice of this module was published for: its resource
// label, or else the name in its ServiceWithHealthchecks owner reference ("" when neither says).
func ResourceOf(s *discoveryv1.EndpointSlice) string {
	if name := s.Labels[wellknown.LabelResource]; name != "" {
		return name
	}
	ref, _ := ResourceRef(s.OwnerReferences)
	return ref.Name
}

// PortOf is the Service port a slice publishes, by name ("" for a single unnamed port), as its
// port label records it; ok is false when the slice has no port label (it publishes no port of
// any resource).
func PortOf(s *discoveryv1.EndpointSlice) (port string, ok bool) {
	port, ok = s.Labels[wellknown.LabelPort]
	return port, ok
}

// IsOwnedBy tells whether a slice is this module's and belongs to the live resource with the
// given UID. A slice owned by a deleted resource of the same name is garbage, not ours.
func IsOwnedBy(s *discoveryv1.EndpointSlice, uid types.UID) bool {
	return IsManaged(s) && uid != "" && OwnerUID(s) == uid
}

// Matches tells whether an existing slice was written for this key: same resource, port and
// node, as recorded in its labels and annotation. A slice of the same name that does not match
// is a name collision.
func (k SliceKey) Matches(s *discoveryv1.EndpointSlice) bool {
	addressType := k.AddressType
	if addressType == "" {
		addressType = discoveryv1.AddressTypeIPv4
	}
	return s.Labels[wellknown.LabelResource] == k.Resource &&
		s.Labels[wellknown.LabelPort] == k.Port &&
		s.Annotations[wellknown.AnnotationNode] == k.Node &&
		s.AddressType == addressType
}

// NodeOf is the node a managed slice was published for ("" when it does not say).
func NodeOf(s *discoveryv1.EndpointSlice) string {
	if n := s.Annotations[wellknown.AnnotationNode]; n != "" {
		return n
	}
	return s.Labels[wellknown.LabelNode]
}

// OwnerReference is the owner reference a slice (or the child Service) carries.
func OwnerReference(name string, uid types.UID) metav1.OwnerReference {
	yes := true
	return metav1.OwnerReference{
		APIVersion:         wellknown.Group + "/v1alpha1",
		Kind:               wellknown.Kind,
		Name:               name,
		UID:                uid,
		Controller:         &yes,
		BlockOwnerDeletion: &yes,
	}
}
