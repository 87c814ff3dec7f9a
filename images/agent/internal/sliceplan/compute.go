// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package sliceplan

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/deckhouse/service-with-healthchecks/api/notready"
	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
)

// Compute returns the slices of (resource, node), sorted by name. A port with no published
// endpoint on the node has no slice: a slice is not created while all its endpoints are
// undecided and were never published.
func Compute(in Input) []Desired {
	shared := newSharedParts(in)
	parts := make([]podParts, len(in.Pods))
	cands, users := candidates(in, shared, parts)
	// Each slice lists its endpoints by address (pods that share one, host-network pods, in
	// the order of in.Pods): the candidates are sorted once, not each slice's endpoints, which
	// are more than twice their size to move.
	slices.SortStableFunc(cands, func(a, b candidate) int {
		return strings.Compare(parts[a.pod].addresses[a.ip][0], parts[b.pod].addresses[b.ip][0])
	})
	chunks := assignChunks(in, cands, parts)
	// The groups with room for all their candidates: an append per endpoint into growing
	// groups copied a 1,000-endpoint slice's endpoints several times.
	sizes := make(map[sliceGroup]int, len(users))
	for i, c := range cands {
		sizes[sliceGroup{c.gk, chunks[i]}]++
	}
	groups := make(map[sliceGroup][]discoveryv1.Endpoint, len(sizes))
	// When each endpoint's verdict was decided, in the order of the group's endpoints
	// (Desired.Changed).
	changed := make(map[sliceGroup][]time.Time, len(sizes))
	// The reasons of the not-ready pods of each slice, by pod name (notready.Annotation): built
	// only for slices with a pod out.
	var reasons map[sliceGroup]map[string]string
	for i, c := range cands {
		sg := sliceGroup{c.gk, chunks[i]}
		g, ok := groups[sg]
		if !ok {
			g = make([]discoveryv1.Endpoint, 0, sizes[sg])
			changed[sg] = make([]time.Time, 0, sizes[sg])
		}
		groups[sg] = append(g, shared.endpoint(parts[c.pod], c.ip, c.ready, c.serving, c.terminating))
		changed[sg] = append(changed[sg], c.changed)
		if !c.ready {
			if reasons == nil {
				reasons = map[sliceGroup]map[string]string{}
			}
			if reasons[sg] == nil {
				reasons[sg] = map[string]string{}
			}
			reasons[sg][in.Pods[c.pod].Pod.Name] = c.reason
		}
	}
	primary := primaryNumbers(in, users)

	out := make([]Desired, 0, len(groups))
	for sg, eps := range groups {
		gk := sg.gk
		sp := portOf(in.Resource, gk.port)
		key := slicemeta.SliceKey{Resource: in.Resource.Name, Port: sp.Name, Node: in.Node, AddressType: gk.family, Chunk: sg.chunk}
		if gk.family == discoveryv1.AddressTypeIPv4 {
			key.AddressType = ""
		}
		if primary[portFamily{gk.port, gk.family}] != gk.number {
			key.SplitPort = gk.number
		}
		sl := newSlice(in, key, gk.family, sp, gk.number, eps)
		if note := notready.Encode(reasons[sg]); note != "" {
			sl.Annotations[notready.Annotation] = note
		}
		out = append(out, Desired{Key: key, Slice: sl, Changed: changed[sg]})
	}
	slices.SortFunc(out, func(a, b Desired) int { return cmp.Compare(a.Slice.Name, b.Slice.Name) })
	return out
}

// candidate is one endpoint of a pod on a port in one address family, before it is grouped
// into its slice.
type candidate struct {
	gk                          groupKey
	pod                         int
	ip                          int
	ready, serving, terminating bool
	// reason is why a not-ready endpoint is out (outReason), "" for a ready one.
	reason string
	// changed is when its verdict was decided (portrule.Endpoint.Changed; zero for one carried
	// over undecided).
	changed time.Time
}

// candidates are the endpoints Compute publishes, with the conditions they are published
// with, and users counts every endpoint that uses a number, also one left out while
// undecided, so the primary number does not depend on which pods' probes decide first. It
// fills parts, the shared parts of each pod.
func candidates(in Input, shared *sharedParts, parts []podParts) ([]candidate, map[groupKey]int) {
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
	// The reasons the existing slices' notes carry, indexed as the conditions are: only an
	// undecided endpoint carried out asks for one.
	var carriedWhy map[reasonKey]string
	carriedReasonOf := func(k reasonKey) string {
		if carriedWhy == nil {
			carriedWhy = carriedReasons(in.Existing)
		}
		return carriedWhy[k]
	}
	families := Families(in.Resource)
	cands := make([]candidate, 0, len(in.Pods)*max(1, len(in.Resource.Spec.Ports)))
	users := map[groupKey]int{}
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
				reason := ep.Reason
				if !ep.Decided {
					c, published := carriedOf(carryKey{portName, p.Pod.UID, ip})
					if !published && !ep.PublishNotReady {
						// Never published and not decided yet: left out until its probes
						// decide. Published ready=false it would hide the same address's
						// ready entry in the built-in slices while a Service is adopted
						// (kube-proxy keeps one entry per address).
						continue
					}
					ready, serving, terminating = portrule.Conditions(published && c.Serving != nil && *c.Serving, ep.Terminating, ep.PublishNotReady)
					reason = ""
					if !ready {
						// Out as an earlier agent published it: why, as that agent said.
						reason = carriedReasonOf(reasonKey{portName, p.Pod.Name})
					}
				}
				// Rule 8: a drained pod takes no new connection, whatever its verdict. A serving
				// one is published terminating too: ready=false, serving=true, terminating=false
				// is an active backend to Cilium 1.15 (one in maintenance to 1.20), while
				// ready=false, serving=true, terminating=true reads the same on kube-proxy and
				// every Cilium: no new connection while another endpoint is ready, established
				// ones kept (docs/CONFIGURATION.md, "How dataplanes read the slices"). A drained
				// pod that does not serve is out everywhere as it is.
				ready = ready && !ep.Drained
				terminating = terminating || (ep.Drained && serving)
				cand := candidate{gk: gk, pod: pi, ip: i, ready: ready, serving: serving, terminating: terminating}
				if ep.Decided {
					cand.changed = ep.Changed
				}
				if !ready {
					cand.reason = outReason(reason, serving, terminating, ep.Drained)
				}
				cands = append(cands, cand)
			}
		}
	}
	return cands, users
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

// reasonKey finds the reason of a pod on a port in the existing slices' notes.
type reasonKey struct {
	port, pod string
}

// carriedReasons indexes the reasons of the existing slices' notes (notready.Annotation) by
// port and pod name; a note the agent cannot read carries nothing.
func carriedReasons(existing []*discoveryv1.EndpointSlice) map[reasonKey]string {
	out := map[reasonKey]string{}
	for _, s := range existing {
		note, err := notready.Parse(s.Annotations[notready.Annotation])
		if err != nil {
			continue
		}
		port, _ := slicemeta.PortOf(s)
		for pod, why := range note {
			out[reasonKey{port, pod}] = why
		}
	}
	return out
}

// outReason is why a not-ready endpoint is out, for the slice's note: the verdict's reason
// (the words of the agent's PortNotReady Event), with the drain named when the pod is drained;
// a terminating pod that passes its probes is out because it terminates.
func outReason(reason string, serving, terminating, drained bool) string {
	switch {
	case drained && reason != "" && !serving:
		return reason + "; " + portrule.ReasonDrained
	case drained:
		return portrule.ReasonDrained
	case reason == "" && terminating:
		return "pod is terminating"
	}
	return reason
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
