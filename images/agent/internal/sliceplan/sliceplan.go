// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package sliceplan computes, as pure functions, the EndpointSlices one agent publishes for one
// resource on its node (DESIGN §4), and the plan that turns the existing slices into them.
package sliceplan

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
)

// Pod is one selected pod of the node with the per-port rule applied to it.
type Pod struct {
	Pod *corev1.Pod
	// Endpoints has one entry per spec.ports entry (portrule.Evaluate).
	Endpoints []portrule.Endpoint
}

// Input is everything the desired slices of one (resource, node) depend on.
type Input struct {
	Resource *v1alpha1.ServiceWithHealthchecks
	Node     string
	// Zone is the node's topology.kubernetes.io/zone label ("" leaves endpoints without a zone).
	Zone string
	Pods []Pod
	// Existing are the slices this agent published before for (resource, node). An endpoint
	// whose verdict is undecided keeps the conditions it has there (DESIGN §5); one that is in
	// none of them is left out until its verdict is decided (unless the resource publishes
	// not-ready addresses). A split port keeps its primary number.
	Existing []*discoveryv1.EndpointSlice
}

// Desired is one slice to publish and the key it is published under.
type Desired struct {
	Key   slicemeta.SliceKey
	Slice *discoveryv1.EndpointSlice
}

// carryKey finds an endpoint of a pod on a port in the existing slices.
type carryKey struct {
	port    string
	podUID  types.UID
	address string
}

// groupKey is one candidate slice before primary numbers are chosen.
type groupKey struct {
	port   int
	family discoveryv1.AddressType
	number int32
}

// Compute returns the slices of (resource, node), sorted by name. A port with no published
// endpoint on the node has no slice: a slice is not created while all its endpoints are
// undecided and were never published.
func Compute(in Input) []Desired {
	primaries := map[string]int32{} // "<port>/<family>" -> number of the unsuffixed slice
	for _, s := range in.Existing {
		port, _ := slicemeta.PortOf(s)
		// The unsuffixed slice, also under the name IPv6 slices had before (an upgraded agent
		// keeps the primary number while it renames them).
		if k := (slicemeta.SliceKey{Resource: in.Resource.Name, Port: port, Node: in.Node, AddressType: s.AddressType}); len(s.Ports) == 1 && s.Ports[0].Port != nil && (s.Name == k.Name() || s.Name == k.LegacyName()) {
			primaries[port+"/"+string(s.AddressType)] = *s.Ports[0].Port
		}
	}
	// The conditions the existing slices carry, indexed only when an undecided endpoint asks
	// for them: in steady state every verdict is decided and a 1,000-endpoint slice is not
	// indexed per reconcile.
	var carried map[carryKey]discoveryv1.EndpointConditions
	carriedOf := func(k carryKey) (discoveryv1.EndpointConditions, bool) {
		if carried == nil {
			carried = carriedConditions(in.Existing)
		}
		c, ok := carried[k]
		return c, ok
	}
	families := Families(in.Resource)

	// The candidates first, then the groups with room for all of them: an append per endpoint
	// into growing groups copied a 1,000-endpoint slice's endpoints several times.
	type candidate struct {
		gk                          groupKey
		pod                         int
		ip                          int
		ready, serving, terminating bool
	}
	cands := make([]candidate, 0, len(in.Pods)*max(1, len(in.Resource.Spec.Ports)))
	// users counts every endpoint that uses a number, also one left out while undecided, so
	// the primary number does not depend on which pods' probes decide first.
	users := map[groupKey]int{}
	shared := newSharedParts(in)
	parts := make([]podParts, len(in.Pods))
	for pi, p := range in.Pods {
		ips := podIPs(p.Pod)
		parts[pi] = shared.pod(pi, p.Pod, ips)
		for _, ep := range p.Endpoints {
			if !ep.Published || ep.PortIndex >= len(in.Resource.Spec.Ports) {
				continue
			}
			portName := portOf(in.Resource, ep.PortIndex).Name
			for i, ip := range ips {
				family := addressType(ip)
				if family == "" || (families != nil && !slices.Contains(families, family)) {
					continue
				}
				gk := groupKey{port: ep.PortIndex, family: family, number: ep.TargetPort}
				users[gk]++
				ready, serving, terminating := ep.Ready, ep.Serving, ep.Terminating
				if !ep.Decided {
					c, published := carriedOf(carryKey{portName, p.Pod.UID, ip})
					if !published && !ep.PublishNotReady {
						// Never published and not decided yet: left out until its probes
						// decide. Published ready=false it would hide the same address's
						// ready entry in the built-in slices while a Service is adopted
						// (kube-proxy keeps one entry per address).
						continue
					}
					serving = false
					if published && c.Serving != nil {
						serving = *c.Serving
					}
					ready, serving, terminating = portrule.Conditions(serving, ep.Terminating, ep.PublishNotReady)
				}
				cands = append(cands, candidate{gk: gk, pod: pi, ip: i, ready: ready, serving: serving, terminating: terminating})
			}
		}
	}
	// Each slice lists its endpoints by address (pods that share one, host-network pods, in
	// the order of in.Pods): the candidates are sorted once, not each slice's endpoints, which
	// are more than twice their size to move.
	slices.SortStableFunc(cands, func(a, b candidate) int {
		return strings.Compare(parts[a.pod].addresses[a.ip][0], parts[b.pod].addresses[b.ip][0])
	})
	groups := make(map[groupKey][]discoveryv1.Endpoint, len(users))
	for _, c := range cands {
		g, ok := groups[c.gk]
		if !ok {
			g = make([]discoveryv1.Endpoint, 0, users[c.gk])
		}
		groups[c.gk] = append(g, shared.endpoint(parts[c.pod], c.ip, c.ready, c.serving, c.terminating))
	}

	// Choose the primary (unsuffixed) number of each (port, family): the one already published
	// unsuffixed when it is still in use, else the number with the most endpoints (published or
	// waiting for their verdict), then the smallest.
	type pf struct {
		port   int
		family discoveryv1.AddressType
	}
	primary := map[pf]int32{}
	counts := map[pf]map[int32]int{}
	for gk, n := range users {
		k := pf{gk.port, gk.family}
		if counts[k] == nil {
			counts[k] = map[int32]int{}
		}
		counts[k][gk.number] = n
	}
	for k, byNumber := range counts {
		if n, ok := primaries[portOf(in.Resource, k.port).Name+"/"+string(k.family)]; ok && byNumber[n] > 0 {
			primary[k] = n
			continue
		}
		best, bestCount := int32(0), -1
		for n, c := range byNumber {
			if c > bestCount || (c == bestCount && n < best) {
				best, bestCount = n, c
			}
		}
		primary[k] = best
	}

	out := make([]Desired, 0, len(groups))
	for gk, eps := range groups {
		sp := portOf(in.Resource, gk.port)
		key := slicemeta.SliceKey{Resource: in.Resource.Name, Port: sp.Name, Node: in.Node, AddressType: gk.family}
		if gk.family == discoveryv1.AddressTypeIPv4 {
			key.AddressType = ""
		}
		if primary[pf{gk.port, gk.family}] != gk.number {
			key.SplitPort = gk.number
		}
		out = append(out, Desired{Key: key, Slice: newSlice(in, key, gk.family, sp, gk.number, eps)})
	}
	slices.SortFunc(out, func(a, b Desired) int { return cmp.Compare(a.Slice.Name, b.Slice.Name) })
	return out
}

// Families are the address families the resource's Service has, as far as the resource says,
// and so the families its slices are published in: the built-in EndpointSlice controller
// publishes one slice per family of the Service's ipFamilies, kube-proxy routes each ClusterIP
// from the slices of its family, and CoreDNS answers A and AAAA queries of a headless Service
// from the slices of each family. nil means every family the pods have.
//
//   - ipFamilyPolicy RequireDualStack or PreferDualStack, two ipFamilies or two clusterIPs: nil.
//     (In a single-stack cluster the pods have one family, so PreferDualStack publishes that.)
//   - one ipFamilies entry: that family (SingleStack, the API server's default policy then).
//   - otherwise the Service is single-stack in the cluster's primary family, which the resource
//     does not name: the family of spec.clusterIP when it is an address, else of status.clusterIP
//     (the Service's, which the controller writes and the agents wait for before publishing).
//   - a headless resource that names no family: nil (its ClusterIP "None" names none either).
func Families(swh *v1alpha1.ServiceWithHealthchecks) []discoveryv1.AddressType {
	s := &swh.Spec
	if p := s.IPFamilyPolicy; p != nil && (*p == corev1.IPFamilyPolicyRequireDualStack || *p == corev1.IPFamilyPolicyPreferDualStack) {
		return nil
	}
	if len(s.IPFamilies) > 1 || len(s.ClusterIPs) > 1 {
		return nil
	}
	if len(s.IPFamilies) == 1 {
		return []discoveryv1.AddressType{discoveryv1.AddressType(s.IPFamilies[0])}
	}
	for _, ip := range []string{s.ClusterIP, swh.Status.ClusterIP} {
		if f := addressType(ip); f != "" {
			return []discoveryv1.AddressType{f}
		}
	}
	return nil
}

func newSlice(in Input, key slicemeta.SliceKey, family discoveryv1.AddressType, sp v1alpha1.ServicePort, number int32, eps []discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:            key.Name(),
			Namespace:       in.Resource.Namespace,
			Labels:          key.Labels(),
			Annotations:     key.Annotations(),
			OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference(in.Resource.Name, in.Resource.UID)},
		},
		AddressType: family,
		Endpoints:   eps,
	}
	if sp.Port == 0 {
		// A resource without ports: the slice lists addresses only, as the built-in
		// controller's slices of a headless Service without ports do.
		return s
	}
	name, proto, port := sp.Name, sp.Protocol, number
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	s.Ports = []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port, AppProtocol: appProtocol(sp)}}
	return s
}

// appProtocol is the port's appProtocol when the EndpointSlice API accepts it (a qualified
// name). Admission refuses other values now; one admitted before that rule is left out, so the
// port is still published (the status reports the value: SpecOutOfBounds).
func appProtocol(sp v1alpha1.ServicePort) *string {
	if sp.AppProtocol == nil || len(validation.IsQualifiedName(*sp.AppProtocol)) > 0 {
		return nil
	}
	return sp.AppProtocol
}

// portOf is the Service port of an endpoint's PortIndex; the zero port for portrule.NoPort.
func portOf(swh *v1alpha1.ServiceWithHealthchecks, index int) v1alpha1.ServicePort {
	if index == portrule.NoPort {
		return v1alpha1.ServicePort{}
	}
	return swh.Spec.Ports[index]
}

// carriedConditions indexes the conditions of the existing slices' endpoints by port, pod and
// address.
func carriedConditions(existing []*discoveryv1.EndpointSlice) map[carryKey]discoveryv1.EndpointConditions {
	n := 0
	for _, s := range existing {
		n += len(s.Endpoints)
	}
	carried := make(map[carryKey]discoveryv1.EndpointConditions, n)
	for _, s := range existing {
		port, _ := slicemeta.PortOf(s)
		for _, e := range s.Endpoints {
			if e.TargetRef == nil || len(e.Addresses) == 0 {
				continue
			}
			carried[carryKey{port, e.TargetRef.UID, e.Addresses[0]}] = e.Conditions
		}
	}
	return carried
}

// sharedParts are the parts of the endpoints of one Compute that point to the same values: the
// node name, the zone and the conditions (eight combinations) for every endpoint, a pod's
// reference, hostname and addresses for all its endpoints (ports and families). The endpoints are
// read-only once built (they are compared and serialized), so sharing them saves most of the
// allocations of a reconcile.
type sharedParts struct {
	node, zone *string
	conditions [8]discoveryv1.EndpointConditions
	resource   string
	// refs are the pods' references, by index in Input.Pods: one allocation for all of them.
	refs []corev1.ObjectReference
}

func newSharedParts(in Input) *sharedParts {
	sp := &sharedParts{node: &in.Node, resource: in.Resource.Name, refs: make([]corev1.ObjectReference, len(in.Pods))}
	if in.Zone != "" {
		sp.zone = &in.Zone
	}
	values := [2]bool{false, true}
	for i := range sp.conditions {
		sp.conditions[i] = discoveryv1.EndpointConditions{Ready: &values[i&1], Serving: &values[i>>1&1], Terminating: &values[i>>2&1]}
	}
	return sp
}

// podParts are the shared parts of one pod's endpoints.
type podParts struct {
	ref       *corev1.ObjectReference
	hostname  *string
	addresses [][]string
}

// pod are the shared parts of the endpoints of pod, the i-th of Input.Pods.
func (sp *sharedParts) pod(i int, pod *corev1.Pod, ips []string) podParts {
	sp.refs[i] = corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	pp := podParts{ref: &sp.refs[i]}
	// Headless DNS records per pod, as the built-in controller does.
	if pod.Spec.Hostname != "" && pod.Spec.Subdomain == sp.resource {
		pp.hostname = &pod.Spec.Hostname
	}
	all := make([]string, len(ips))
	copy(all, ips)
	pp.addresses = make([][]string, len(ips))
	for i := range all {
		pp.addresses[i] = all[i : i+1 : i+1]
	}
	return pp
}

// endpoint is the endpoint of the pod's i-th address.
func (sp *sharedParts) endpoint(pod podParts, i int, ready, serving, terminating bool) discoveryv1.Endpoint {
	c := 0
	if ready {
		c |= 1
	}
	if serving {
		c |= 2
	}
	if terminating {
		c |= 4
	}
	return discoveryv1.Endpoint{
		Addresses:  pod.addresses[i],
		Conditions: sp.conditions[c],
		NodeName:   sp.node,
		Zone:       sp.zone,
		Hostname:   pod.hostname,
		TargetRef:  pod.ref,
	}
}

func podIPs(pod *corev1.Pod) []string {
	var ips []string
	for _, ip := range pod.Status.PodIPs {
		if ip.IP != "" && !slices.Contains(ips, ip.IP) {
			ips = append(ips, ip.IP)
		}
	}
	if len(ips) == 0 && pod.Status.PodIP != "" {
		ips = append(ips, pod.Status.PodIP)
	}
	return ips
}

func addressType(ip string) discoveryv1.AddressType {
	a, err := netip.ParseAddr(ip)
	switch {
	case err != nil:
		return ""
	case a.Is4() || a.Is4In6():
		return discoveryv1.AddressTypeIPv4
	default:
		return discoveryv1.AddressTypeIPv6
	}
}

// Conflict is a desired slice name held by a slice this agent may not write.
type Conflict struct {
	Name string
	// Holder describes who holds the name, for the Event.
	Holder string
}

// Plan is what turns the existing slices into the desired ones. Update entries are copies of
// the existing objects (with their resourceVersion) carrying the desired content.
type Plan struct {
	Create    []*discoveryv1.EndpointSlice
	Update    []*discoveryv1.EndpointSlice
	Delete    []*discoveryv1.EndpointSlice
	Conflicts []Conflict
	// Keys holds the key of every desired slice by name: the publisher checks against it that a
	// slice it retries on, or finds in its way, is still this (resource, port, node)'s.
	Keys map[string]slicemeta.SliceKey
}

// HasChanges tells whether applying the plan writes anything.
func (p Plan) HasChanges() bool {
	return len(p.Create)+len(p.Update)+len(p.Delete) > 0
}

// Diff plans the writes from existing to desired for (resource, node). existing holds, by name,
// the slices this agent knows: its own for (resource, node) and any other slice that holds a
// desired name. A slice is written only when it is ours (managed by us, published for the same
// resource, port and node) and owned by the live resource uid — or when it is ours but owned by
// a deleted resource of the same name, which is garbage the live resource takes over. A name
// held by anything else is a Conflict and is not touched. Own slices of the node that are no
// longer desired are deleted.
func Diff(resource string, uid types.UID, node string, desired []Desired, existing map[string]*discoveryv1.EndpointSlice) Plan {
	p := Plan{Keys: make(map[string]slicemeta.SliceKey, len(desired))}
	want := map[string]bool{}
	for _, d := range desired {
		want[d.Slice.Name] = true
		p.Keys[d.Slice.Name] = d.Key
		cur, ok := existing[d.Slice.Name]
		if !ok {
			p.Create = append(p.Create, d.Slice)
			continue
		}
		if !slicemeta.IsManaged(cur) || !d.Key.Matches(cur) {
			p.Conflicts = append(p.Conflicts, ConflictOf(d.Slice.Name, cur))
			continue
		}
		if u, changed := Merge(cur, d.Slice); changed {
			p.Update = append(p.Update, u)
		}
	}
	names := make([]string, 0, len(existing))
	for name := range existing {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		cur := existing[name]
		if want[name] || !slicemeta.IsOwnedBy(cur, uid) || slicemeta.ResourceOf(cur) != resource || slicemeta.NodeOf(cur) != node {
			continue
		}
		p.Delete = append(p.Delete, cur)
	}
	return p
}

// ConflictOf describes the conflict of a desired name held by cur, a slice this agent may not
// write.
func ConflictOf(name string, cur *discoveryv1.EndpointSlice) Conflict {
	c := Conflict{Name: name}
	switch {
	case !slicemeta.IsManaged(cur):
		if m := cur.Labels[discoveryv1.LabelManagedBy]; m != "" {
			c.Holder = "a slice managed by " + m
		} else {
			c.Holder = "a slice not managed by this module"
		}
	default:
		port, _ := slicemeta.PortOf(cur)
		c.Holder = fmt.Sprintf("the slice of resource %q, port %q, node %q", slicemeta.ResourceOf(cur), port, slicemeta.NodeOf(cur))
	}
	return c
}

// Merge returns a copy of cur with the content of want, and whether anything differs.
// Labels and annotations of others are kept; ours are set.
func Merge(cur, want *discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, bool) {
	// Compare before copying: in steady state nothing differs and nothing is allocated.
	if !differs(cur, want) {
		return cur, false
	}
	// The endpoints are replaced: copy everything but them (a 1,000-endpoint slice's copy
	// would be most of a reconcile's allocations).
	shallow := *cur
	shallow.Endpoints = nil
	u := shallow.DeepCopy()
	if u.Labels == nil {
		u.Labels = map[string]string{}
	}
	maps.Copy(u.Labels, want.Labels)
	if _, ok := want.Labels[slicemeta.LabelNode]; !ok {
		delete(u.Labels, slicemeta.LabelNode)
	}
	if u.Annotations == nil {
		u.Annotations = map[string]string{}
	}
	maps.Copy(u.Annotations, want.Annotations)
	if refs, changed := ownerRefs(u.OwnerReferences, want.OwnerReferences[0]); changed {
		u.OwnerReferences = refs
	}
	u.Endpoints, u.Ports = want.Endpoints, want.Ports
	return u, true
}

// differs tells whether Merge would change anything in cur.
func differs(cur, want *discoveryv1.EndpointSlice) bool {
	for k, v := range want.Labels {
		if old, ok := cur.Labels[k]; !ok || old != v {
			return true
		}
	}
	if _, ok := want.Labels[slicemeta.LabelNode]; !ok {
		if _, had := cur.Labels[slicemeta.LabelNode]; had {
			return true
		}
	}
	for k, v := range want.Annotations {
		if old, ok := cur.Annotations[k]; !ok || old != v {
			return true
		}
	}
	if ownerRefsDiffer(cur.OwnerReferences, want.OwnerReferences[0]) {
		return true
	}
	return !sameEndpoints(cur.Endpoints, want.Endpoints) || !reflect.DeepEqual(cur.Ports, want.Ports)
}

// sameEndpoints compares endpoint lists field by field: reflect.DeepEqual allocates for every
// pointer it follows, and this runs for every endpoint of every reconcile. Fields the agent never
// sets (hints, deprecated topology) are compared with reflect only when either side has them.
func sameEndpoints(a, b []discoveryv1.Endpoint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := &a[i], &b[i]
		if !slices.Equal(x.Addresses, y.Addresses) ||
			!ptr.Equal(x.Conditions.Ready, y.Conditions.Ready) ||
			!ptr.Equal(x.Conditions.Serving, y.Conditions.Serving) ||
			!ptr.Equal(x.Conditions.Terminating, y.Conditions.Terminating) ||
			!ptr.Equal(x.Hostname, y.Hostname) || !ptr.Equal(x.NodeName, y.NodeName) || !ptr.Equal(x.Zone, y.Zone) ||
			!sameTargetRef(x.TargetRef, y.TargetRef) {
			return false
		}
		if (x.Hints != nil || y.Hints != nil || len(x.DeprecatedTopology) > 0 || len(y.DeprecatedTopology) > 0) &&
			(!reflect.DeepEqual(x.Hints, y.Hints) || !reflect.DeepEqual(x.DeprecatedTopology, y.DeprecatedTopology)) {
			return false
		}
	}
	return true
}

func sameTargetRef(a, b *corev1.ObjectReference) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// sameRef compares two owner references field by field (without reflection: it runs for every
// slice of every reconcile).
func sameRef(a, b metav1.OwnerReference) bool {
	return a.APIVersion == b.APIVersion && a.Kind == b.Kind && a.Name == b.Name && a.UID == b.UID &&
		ptr.Equal(a.Controller, b.Controller) && ptr.Equal(a.BlockOwnerDeletion, b.BlockOwnerDeletion)
}

// ownerRefsDiffer tells whether ownerRefs would change refs: ref is missing, or there is
// another ServiceWithHealthchecks reference besides it.
func ownerRefsDiffer(refs []metav1.OwnerReference, ref metav1.OwnerReference) bool {
	found := 0
	ours := 0
	for _, r := range refs {
		if slicemeta.IsResourceRef(r) {
			ours++
			if sameRef(r, ref) {
				found++
			}
		}
	}
	return found != 1 || ours != 1
}

// ownerRefs replaces any ServiceWithHealthchecks owner reference with ref and keeps the others.
func ownerRefs(refs []metav1.OwnerReference, ref metav1.OwnerReference) ([]metav1.OwnerReference, bool) {
	out := []metav1.OwnerReference{ref}
	found := false
	for _, r := range refs {
		if slicemeta.IsResourceRef(r) {
			if sameRef(r, ref) {
				found = true
			}
			continue
		}
		out = append(out, r)
	}
	changed := !found || len(out) != len(refs)
	return out, changed
}
