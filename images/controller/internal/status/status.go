// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package status computes the status of a ServiceWithHealthchecks from what the controller
// observed. It is a pure function; the reconciler writes the result only when it differs from
// the status the resource already has.
package status

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deckhouse/service-with-healthchecks/api/notready"
	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// Reasons of the conditions computed here.
const (
	// ReasonEndpointsAvailable: every port has at least one ready endpoint.
	ReasonEndpointsAvailable = "EndpointsAvailable"
	// ReasonNoReadyEndpoints: some port has no ready endpoint.
	ReasonNoReadyEndpoints = "NoReadyEndpoints"
	// ReasonNoPorts: the resource exposes no port and is not headless (admission refuses that
	// shape), so no endpoint can be available.
	ReasonNoPorts = "NoPorts"
	// ReasonReady: the Service is synced and every port has a ready endpoint.
	ReasonReady = "Ready"
	// ReasonServiceNotSynced: Ready is False because ServiceSynced is not True.
	ReasonServiceNotSynced = "ServiceNotSynced"
	// ReasonNameCollision: slice names of this resource collide with another live resource's.
	ReasonNameCollision = "NameCollision"
	// ReasonNoCollision: no slice name collision with another live resource.
	ReasonNoCollision = "NoCollision"
	// ReasonAgentsFresh: no agent publishing endpoints of this resource looks stale.
	ReasonAgentsFresh = "AgentsFresh"
	// ReasonEndpointsWithdrawn: agents of nodes with endpoints of this resource look stale;
	// those endpoints are withdrawn (ready=false, serving=false) until the agents return.
	ReasonEndpointsWithdrawn = "EndpointsWithdrawn"
	// ReasonWithdrawalHeld: agents of nodes with endpoints of this resource look stale, but
	// more than half of all agents do (the liveness guard): nothing is withdrawn.
	ReasonWithdrawalHeld = "WithdrawalHeld"
)

// maxNamedNodes bounds the node names a condition message lists.
const maxNamedNodes = 5

// Agents is the liveness judgement the status shows (DESIGN §5).
type Agents struct {
	// Known is how many agents the controller sees.
	Known int
	// Stale are the nodes whose agent looks stale, sorted.
	Stale []string
	// Guarded is true while the liveness guard holds: nothing is withdrawn.
	Guarded bool
	// LookStale is, while the guard holds, how many agents look stale at once (the stale ones
	// and those silent long enough to have stopped with them); the stale ones when smaller.
	LookStale int
	// LeaseNamespace is where the agents renew their Leases (named in messages).
	LeaseNamespace string
}

// Observed is everything the status is computed from.
type Observed struct {
	// Resource is the live resource; its current status is the starting point.
	Resource *v1alpha1.ServiceWithHealthchecks
	// Service is the child Service when this resource owns it (or is adopting it), nil otherwise.
	Service *corev1.Service
	// ServiceSynced is the ServiceSynced condition decided by the Service sync.
	ServiceSynced metav1.Condition
	// Slices are the EndpointSlices of this resource (owned by its UID). The per-port counts,
	// EndpointsAvailable and Ready are computed from them.
	Slices []discoveryv1.EndpointSlice
	// Ports are Ports(Resource, Slices) when the caller has computed them already (the
	// reconciler does, once per reconcile); nil computes them here.
	Ports []v1alpha1.PortStatus
	// Neighbours are other live resources of the namespace: at least those named by
	// CollisionCandidates(Resource) (the resource itself, resources of other namespaces and
	// resources being deleted are skipped). SliceNameConflict is computed from their names.
	Neighbours []v1alpha1.ServiceWithHealthchecks
	// Agents is the liveness judgement; nil when the controller does not judge the agents
	// (the AgentsStale condition is then left as it is).
	Agents *Agents
	// OverBudget are the agents' reports of the resource over their probe budget, by node
	// (only read while Agents is set: the reports come with the liveness runner's reading).
	OverBudget []NodeBudget
	// Now stamps conditions whose status changes.
	Now metav1.Time
}

// Compute returns the status the resource should have. Conditions this function does not
// compute are kept as they are.
func Compute(o Observed) v1alpha1.ServiceWithHealthchecksStatus {
	st := *o.Resource.Status.DeepCopy()
	st.ObservedGeneration = o.Resource.Generation

	synced := o.ServiceSynced
	synced.Type = v1alpha1.ConditionServiceSynced
	synced.ObservedGeneration = o.Resource.Generation
	synced.LastTransitionTime = o.Now
	meta.SetStatusCondition(&st.Conditions, synced)

	st.Ports = o.Ports
	if st.Ports == nil {
		st.Ports = Ports(o.Resource, o.Slices)
	}
	if o.Agents != nil {
		st.Ports = withdrawnReasons(st.Ports, o.Agents)
	}
	st.ReadySummary = Summary(st.Ports)
	available := endpointsAvailable(st.Ports, WithoutReadyIn(o.Resource, o.Slices, ServiceFamilies(o.Service)))
	if len(o.Resource.Spec.Ports) == 0 && o.Resource.Spec.ClusterIP == corev1.ClusterIPNone {
		// A headless resource without ports publishes port-less slices: its endpoints are
		// counted as one pseudo-port without a name or number.
		pseudo := Ports(&v1alpha1.ServiceWithHealthchecks{Spec: v1alpha1.ServiceWithHealthchecksSpec{Ports: []v1alpha1.ServicePort{{}}}}, o.Slices)
		st.ReadySummary = Summary(pseudo)
		available = endpointsAvailable(pseudo, WithoutReady(pseudo))
		if available.Status == metav1.ConditionTrue {
			available.Message = "a ready endpoint is published (the resource has no ports)"
		} else {
			available.Message = "no ready endpoint is published (the resource has no ports)"
		}
	}
	ready := metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonReady, Message: "the Service is synced and every port has a ready endpoint"}
	switch {
	case synced.Status != metav1.ConditionTrue:
		ready = metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonServiceNotSynced, Message: "ServiceSynced is not True: " + synced.Message}
	case available.Status != metav1.ConditionTrue:
		ready = metav1.Condition{Status: metav1.ConditionFalse, Reason: available.Reason, Message: available.Message}
	}
	conds := []metav1.Condition{
		withType(available, v1alpha1.ConditionEndpointsAvailable),
		withType(ready, v1alpha1.ConditionReady),
		withType(nameConflict(o.Resource, o.Neighbours), v1alpha1.ConditionSliceNameConflict),
		// Not part of Ready either: what such values break shows in the other conditions (an
		// appProtocol the Service API refuses makes ServiceSynced Invalid, a path the probe cannot
		// send leaves its ports without ready endpoints); this one says why.
		withType(specOutOfBounds(&o.Resource.Spec), v1alpha1.ConditionSpecOutOfBounds),
	}
	if o.Agents != nil {
		// Deliberately not part of Ready: the endpoints are what the agents published (or
		// withdrew), and EndpointsAvailable already follows them.
		conds = append(conds, withType(agentsStale(o.Agents, o.Slices), v1alpha1.ConditionAgentsStale))
		// Not part of Ready either: the ports over budget show as not serving.
		if c := probeBudget(o.Resource.Status.Conditions, o.OverBudget); c != nil {
			conds = append(conds, *c)
		}
	}
	for _, c := range conds {
		c.ObservedGeneration = o.Resource.Generation
		c.LastTransitionTime = o.Now
		meta.SetStatusCondition(&st.Conditions, c)
	}

	if o.Service != nil {
		st.ClusterIP = o.Service.Spec.ClusterIP
		st.LoadBalancer = *o.Service.Status.LoadBalancer.DeepCopy()
	} else {
		st.ClusterIP = ""
		st.LoadBalancer = corev1.LoadBalancerStatus{}
	}
	return st
}

// Changed tells whether the computed status differs from the current one.
func Changed(current, computed *v1alpha1.ServiceWithHealthchecksStatus) bool {
	return !equality.Semantic.DeepEqual(current, computed)
}

func withType(c metav1.Condition, typ string) metav1.Condition {
	c.Type = typ
	return c
}

// endpointKey identifies an endpoint of a port: one pod with one target port number. A
// dual-stack pod is listed in the slice of each family (one address each) and is one endpoint.
type endpointKey struct {
	pod  string
	port int32
}

// podKeys are the keys an endpoint counts under: its pod (targetRef UID, else namespace/name),
// or, for an endpoint that names no pod, each of its addresses.
func podKeys(ep *discoveryv1.Endpoint, port int32) []endpointKey {
	if r := ep.TargetRef; r != nil && (r.UID != "" || r.Name != "") {
		id := string(r.UID)
		if id == "" {
			id = r.Namespace + "/" + r.Name
		}
		return []endpointKey{{pod: "pod:" + id, port: port}}
	}
	keys := make([]endpointKey, 0, len(ep.Addresses))
	for _, a := range ep.Addresses {
		keys = append(keys, endpointKey{pod: "address:" + a, port: port})
	}
	return keys
}

// Ports counts the endpoints of every Service port of swh across its slices (Owned: of this
// module and owned by swh's UID), each slice for the port its port label names. An endpoint is
// a pod with a target port number, counted once however many slices list it — a dual-stack pod
// is in one slice per family and counts once — and is ready when any of them says it is ready
// (an unset ready condition means ready, as kube-proxy reads it). The reconciler computes this
// once per reconcile; the status shows it.
//
// The pods out of a port (not ready) are listed in NotReady (notReady, below) and counted in
// NotReadyOmitted beyond the list.
func Ports(swh *v1alpha1.ServiceWithHealthchecks, sliceList []discoveryv1.EndpointSlice) []v1alpha1.PortStatus {
	if len(swh.Spec.Ports) == 0 {
		return nil
	}
	out := make([]v1alpha1.PortStatus, 0, len(swh.Spec.Ports))
	room := v1alpha1.MaxNotReadyListed
	for _, p := range swh.Spec.Ports {
		ready := map[endpointKey]bool{}
		var outs map[endpointKey]*v1alpha1.NotReadyPod
		for i := range sliceList {
			s := &sliceList[i]
			if port, ok := slicemeta.PortOf(s); !ok || port != p.Name {
				continue
			}
			number := sliceNumber(s)
			var note notready.Note
			for j := range s.Endpoints {
				ep := &s.Endpoints[j]
				isReady := ep.Conditions.Ready == nil || *ep.Conditions.Ready
				for _, k := range podKeys(ep, number) {
					ready[k] = ready[k] || isReady
					if isReady || ep.TargetRef == nil {
						continue
					}
					if note == nil {
						note = sliceNote(s)
					}
					if outs == nil {
						outs = map[endpointKey]*v1alpha1.NotReadyPod{}
					}
					outs[k] = notReadyOf(outs[k], ep, s, note)
				}
			}
		}
		ps := v1alpha1.PortStatus{Name: p.Name, Port: p.Port, TotalEndpoints: int32(len(ready))} //nolint:gosec // endpoint counts are far below 2^31.
		for _, r := range ready {
			if r {
				ps.ReadyEndpoints++
			}
		}
		ps.NotReady = notReady(ready, outs, min(room, v1alpha1.MaxNotReadyPerPort))
		room -= len(ps.NotReady)
		ps.NotReadyOmitted = ps.TotalEndpoints - ps.ReadyEndpoints - int32(len(ps.NotReady)) //nolint:gosec // at most MaxNotReadyPerPort.
		out = append(out, ps)
	}
	return out
}

// sliceNote is the note of a slice on why its endpoints are out (notready.Annotation): empty
// when the slice has none or one the controller cannot read (too long, not JSON), whose pods are
// then listed without a reason. Parse bounds and sanitises what it keeps.
func sliceNote(s *discoveryv1.EndpointSlice) notready.Note {
	n, err := notready.Parse(s.Annotations[notready.Annotation])
	if err != nil {
		return notready.Note{}
	}
	return n
}

// notReadyOf is the entry of a pod out of a port, seen in slice s (an endpoint with a pod
// reference, not ready): the pod and node from the endpoint, which the controller audits, and
// the reason from s's own note, only for a pod the slice lists out. A pod in the slices of two
// families keeps the first reason found.
func notReadyOf(cur *v1alpha1.NotReadyPod, ep *discoveryv1.Endpoint, s *discoveryv1.EndpointSlice, note notready.Note) *v1alpha1.NotReadyPod {
	if cur == nil {
		cur = &v1alpha1.NotReadyPod{Pod: cleanName(ep.TargetRef.Name)}
		if ep.NodeName != nil {
			cur.Node = cleanName(*ep.NodeName)
		} else {
			cur.Node = cleanName(slicemeta.NodeOf(s))
		}
	}
	if cur.Reason == "" {
		cur.Reason = note[ep.TargetRef.Name]
	}
	return cur
}

// maxObjectName is the longest object name; the schema bounds pod and node names to it.
const maxObjectName = 253

// cleanName is a name from a slice as the status may hold it: the API server validates node
// names of endpoints but not the names of their targetRefs.
func cleanName(s string) string {
	return notready.Cap(notready.Sanitize(s), maxObjectName)
}

// withdrawnReasons gives the pods out on nodes whose agent looks stale, while the controller
// withdraws their endpoints (not while the liveness guard holds), the controller's reason:
// their agent's note, if any, is older than the withdrawal. ports is not modified.
func withdrawnReasons(ports []v1alpha1.PortStatus, a *Agents) []v1alpha1.PortStatus {
	if a.Guarded || len(a.Stale) == 0 {
		return ports
	}
	out := slices.Clone(ports)
	for i := range out {
		if len(out[i].NotReady) == 0 {
			continue
		}
		out[i].NotReady = slices.Clone(out[i].NotReady)
		for j := range out[i].NotReady {
			e := &out[i].NotReady[j]
			if _, stale := slices.BinarySearch(a.Stale, e.Node); stale {
				e.Reason = notready.Cap("withdrawn by the controller: the agent of node "+e.Node+" has not renewed its Lease", v1alpha1.MaxNotReadyReason)
			}
		}
	}
	return out
}

// notReady lists the pods out of a port (ready false in every slice), the first n by pod name
// and node; an endpoint without a pod reference (which the agents never write) is only counted.
func notReady(ready map[endpointKey]bool, out map[endpointKey]*v1alpha1.NotReadyPod, n int) []v1alpha1.NotReadyPod {
	var list []v1alpha1.NotReadyPod
	for k, e := range out {
		if !ready[k] {
			list = append(list, *e)
		}
	}
	slices.SortFunc(list, func(a, b v1alpha1.NotReadyPod) int {
		return cmp.Or(strings.Compare(a.Pod, b.Pod), strings.Compare(a.Node, b.Node), strings.Compare(a.Reason, b.Reason))
	})
	if len(list) > n {
		list = list[:n]
	}
	return list
}

func sliceNumber(s *discoveryv1.EndpointSlice) int32 {
	if len(s.Ports) > 0 && s.Ports[0].Port != nil {
		return *s.Ports[0].Port
	}
	return 0
}

// WithoutReadyIn names the ports of swh (DisplayName, in spec order) that have no ready
// endpoint in the slices of some family of the Service: families are the Service's
// spec.ipFamilies, and none means that any family counts (no Service to ask yet). kube-proxy
// routes each ClusterIP from the slices of its family only, so a dual-stack Service needs a
// ready endpoint in both: a port that lacks one family is named with it, "http (IPv6)"; a port
// without a ready endpoint in any family, or of a single-stack Service, by its name alone. The
// adoption clears a Service's selector only when this is empty (DESIGN §11), and
// EndpointsAvailable is True only then.
func WithoutReadyIn(swh *v1alpha1.ServiceWithHealthchecks, sliceList []discoveryv1.EndpointSlice, families []corev1.IPFamily) []string {
	var out []string
	for _, p := range swh.Spec.Ports {
		readyIn := map[corev1.IPFamily]bool{}
		for i := range sliceList {
			s := &sliceList[i]
			if port, ok := slicemeta.PortOf(s); !ok || port != p.Name {
				continue
			}
			for j := range s.Endpoints {
				if r := s.Endpoints[j].Conditions.Ready; r == nil || *r {
					readyIn[sliceFamily(s)] = true
					break
				}
			}
		}
		var missing []string
		if len(families) == 0 {
			if len(readyIn) == 0 {
				missing = append(missing, "")
			}
		} else {
			for _, f := range families {
				if !readyIn[f] {
					missing = append(missing, string(f))
				}
			}
		}
		switch {
		case len(missing) == 0:
		case len(families) < 2 || len(missing) == len(families):
			out = append(out, p.DisplayName())
		default:
			for _, f := range missing {
				out = append(out, p.DisplayName()+" ("+f+")")
			}
		}
	}
	return out
}

// sliceFamily is the IP family of a slice's addresses (a slice without an address type, which
// the API server never returns, counts as IPv4, the default of slicemeta.SliceKey).
func sliceFamily(s *discoveryv1.EndpointSlice) corev1.IPFamily {
	if s.AddressType == discoveryv1.AddressTypeIPv6 {
		return corev1.IPv6Protocol
	}
	return corev1.IPv4Protocol
}

// ServiceFamilies are the IP families of a Service (spec.ipFamilies; nil for no Service).
func ServiceFamilies(svc *corev1.Service) []corev1.IPFamily {
	if svc == nil {
		return nil
	}
	return svc.Spec.IPFamilies
}

// Owned are the slices of this module owned by swh's UID: the only ones its status counts.
func Owned(swh *v1alpha1.ServiceWithHealthchecks, all []discoveryv1.EndpointSlice) []discoveryv1.EndpointSlice {
	var out []discoveryv1.EndpointSlice
	for i := range all {
		if slicemeta.IsOwnedBy(&all[i], swh.UID) {
			out = append(out, all[i])
		}
	}
	return out
}

// WithoutReady names the ports (DisplayName) that have no ready endpoint, in spec order.
func WithoutReady(ports []v1alpha1.PortStatus) []string {
	var out []string
	for _, p := range ports {
		if p.ReadyEndpoints == 0 {
			out = append(out, p.DisplayName())
		}
	}
	return out
}

// Summary is the short text of the ready counts: "web 2/3, smtp 1/3", or "2/3" for a single
// unnamed port, "" without ports.
func Summary(ports []v1alpha1.PortStatus) string {
	parts := make([]string, 0, len(ports))
	for _, p := range ports {
		counts := fmt.Sprintf("%d/%d", p.ReadyEndpoints, p.TotalEndpoints)
		if p.Name == "" {
			parts = append(parts, counts)
			continue
		}
		parts = append(parts, p.Name+" "+counts)
	}
	return strings.Join(parts, ", ")
}

// endpointsAvailable is the EndpointsAvailable condition of the ports, of which missing
// (WithoutReadyIn) have no ready endpoint.
func endpointsAvailable(ports []v1alpha1.PortStatus, missing []string) metav1.Condition {
	if len(ports) == 0 {
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonNoPorts, Message: "the resource exposes no port"}
	}
	if len(missing) > 0 {
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonNoReadyEndpoints,
			Message: "no ready endpoint for port " + strings.Join(missing, ", ")}
	}
	return metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonEndpointsAvailable, Message: "every port has a ready endpoint"}
}

// Collisions lists, for the ports of swh, the (resource, port) pairs of the neighbours whose
// slice names collide with swh's on every node: the same slicemeta.Prefix. Collisions that
// depend on node names are not detected.
func Collisions(swh *v1alpha1.ServiceWithHealthchecks, neighbours []v1alpha1.ServiceWithHealthchecks) []string {
	var out []string
	for _, p := range swh.Spec.Ports {
		mine := slicemeta.Prefix(swh.Name, p.Name)
		for i := range neighbours {
			n := &neighbours[i]
			if n.Name == swh.Name || n.Namespace != swh.Namespace || n.DeletionTimestamp != nil {
				continue
			}
			for _, q := range n.Spec.Ports {
				if slicemeta.Prefix(n.Name, q.Name) == mine {
					out = append(out, fmt.Sprintf("port %s collides with resource %s, port %s", p.DisplayName(), n.Name, q.DisplayName()))
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// CollisionCandidates are the names of the only resources of swh's namespace that Collisions
// can find colliding with swh, so that the caller reads those by name instead of listing the
// namespace. Prefix(n, q) ends with "-"; it equals Prefix(swh.Name, p) = P only if
//
//   - q is empty and n is P without its last dash (for p empty that is swh itself), or
//   - q is not empty and n is the part of P before one of its other dashes (q is the rest,
//     without the last dash).
//
// So the candidates are the parts of each of swh's prefixes before each of its dashes, swh's own
// name left out; sorted and without duplicates. For a port p the last one is swh.Name+"-"+p (a
// resource of that name with an unnamed port); no name longer than a prefix can collide with
// it, so with an unnamed port only names shorter than swh.Name are candidates. Without ports
// there are none (Collisions looks only at ports).
func CollisionCandidates(swh *v1alpha1.ServiceWithHealthchecks) []string {
	var out []string
	for _, p := range swh.Spec.Ports {
		prefix := slicemeta.Prefix(swh.Name, p.Name)
		for i := range len(prefix) {
			if prefix[i] == '-' && prefix[:i] != swh.Name && prefix[:i] != "" {
				out = append(out, prefix[:i])
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func nameConflict(swh *v1alpha1.ServiceWithHealthchecks, neighbours []v1alpha1.ServiceWithHealthchecks) metav1.Condition {
	if c := Collisions(swh, neighbours); len(c) > 0 {
		return metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonNameCollision,
			Message: "EndpointSlice names collide on every node, neither resource's slices are overwritten: " + strings.Join(c, "; ")}
	}
	return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonNoCollision, Message: "no slice name collides with another resource's"}
}

// agentsStale says whether an agent that published endpoints of the resource (one of its
// slices names the agent's node) looks stale, and what the controller does about it.
func agentsStale(a *Agents, sliceList []discoveryv1.EndpointSlice) metav1.Condition {
	mine := map[string]bool{}
	for i := range sliceList {
		if n := slicemeta.NodeOf(&sliceList[i]); n != "" {
			mine[n] = true
		}
	}
	var nodes []string
	for _, n := range a.Stale {
		if mine[n] {
			nodes = append(nodes, n)
		}
	}
	if len(nodes) == 0 {
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonAgentsFresh,
			Message: "no agent publishing endpoints of this resource looks stale"}
	}
	leases := "their Leases " + wellknown.AgentLeasePrefix + "<node>"
	if a.LeaseNamespace != "" {
		leases += " in namespace " + a.LeaseNamespace
	}
	if a.Guarded {
		return metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonWithdrawalHeld, Message: fmt.Sprintf(
			"%d of %d agents look stale at once (more than half), so the controller withdraws nothing: "+
				"the endpoints of this resource on %s stay as their agents last published them and may be out of date. "+
				"So many at once usually means the controller does not see the agents' Lease renewals rather than that they died: "+
				"check the API server (health, load), the controller's connectivity to it and its logs, and %s",
			max(a.LookStale, len(a.Stale)), a.Known, nodeList(nodes), leases)}
	}
	who := "the agent of " + nodeList(nodes) + " has not renewed its Lease"
	if len(nodes) > 1 {
		who = "the agents of " + nodeList(nodes) + " have not renewed their Leases"
	}
	return metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonEndpointsWithdrawn, Message: fmt.Sprintf(
		"%s for longer than the grace: the endpoints of this resource there are withdrawn (ready=false, serving=false) "+
			"until the agent publishes again; check the agent pods on those nodes and %s",
		who, leases)}
}

// nodeList names nodes for a message: "node a", "nodes a, b", at most maxNamedNodes names.
func nodeList(nodes []string) string {
	word := "node "
	if len(nodes) > 1 {
		word = "nodes "
	}
	if len(nodes) <= maxNamedNodes {
		return word + strings.Join(nodes, ", ")
	}
	return fmt.Sprintf("%s%s and %d more", word, strings.Join(nodes[:maxNamedNodes], ", "), len(nodes)-maxNamedNodes)
}
