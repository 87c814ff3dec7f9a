// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package status

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/deckhouse/service-with-healthchecks/api/notready"
	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

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

// maxObjectName is the longest object name; the schema bounds pod and node names to it.
const maxObjectName = 253
