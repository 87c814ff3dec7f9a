// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// resourceView works out, per port, which selected pods are published and why the others are
// not: the reason of a pod out is the one the resource's status gives
// (status.ports[].notReady, issue 29 part 5), as kubectl shows it.
func (d *demo) resourceView(swh *v1alpha1.ServiceWithHealthchecks, slcs []discoveryv1.EndpointSlice, pods []corev1.Pod,
	nodes []corev1.Node,
) *ResourceView {
	r := &ResourceView{Name: swh.Name, ClusterIP: swh.Status.ClusterIP, Ready: "Unknown"}
	if c := meta.FindStatusCondition(swh.Status.Conditions, "Ready"); c != nil {
		r.Ready = string(c.Status)
		if c.Status != "True" && c.Message != "" {
			r.Ready += ": " + c.Message
		}
	}
	sel := labels.SelectorFromSet(swh.Spec.Selector)
	exists := map[string]bool{}
	for _, n := range nodes {
		exists[n.Name] = true
	}
	for _, p := range swh.Spec.Ports {
		pv := PortView{Name: p.Name}
		if pv.Name == "" {
			pv.Name = strconv.Itoa(int(p.Port))
		}
		listed, omitted := statusReasons(swh, p.Name)
		for _, pod := range pods {
			if len(swh.Spec.Selector) == 0 || !sel.Matches(labels.Set(pod.Labels)) {
				continue
			}
			st := PodState{Pod: pod.Name, Node: pod.Spec.NodeName}
			// The pod's endpoint in the slice of each family it is published in (a dual-stack
			// pod of a dual-stack resource is in two; the verdict is the same in both).
			var ep discoveryv1.Endpoint
			var found bool
			var published []string
			st.In = true
			for _, ip := range podAddresses(&pod) {
				e, port, ok := findEndpoint(slcs, swh.Name, p.Name, ip)
				if !ok {
					continue
				}
				if !found {
					ep, found = e, true
				}
				published = append(published, net.JoinHostPort(ip, strconv.Itoa(int(port))))
				st.In = st.In && e.Conditions.Ready != nil && *e.Conditions.Ready
			}
			st.In = st.In && found
			if found {
				st.Endpoint = strings.Join(published, ", ")
				st.Serving = ep.Conditions.Serving == nil || *ep.Conditions.Serving
			}
			reason, inStatus := listed[pod.Name]
			agentUp := d.s.AgentPID(pod.Spec.NodeName) != 0
			switch {
			case st.In:
				st.Why = "ready"
			case !exists[pod.Spec.NodeName]:
				st.Why = "node " + pod.Spec.NodeName + " deleted: its slices are removed"
			case found && !st.Serving && !agentUp:
				st.Why = "withdrawn by the controller: the agent of " + pod.Spec.NodeName + " is gone"
			case found && inStatus && reason != "":
				st.Why = reason
			case found && inStatus:
				st.Why = "out (the status gives no reason: its slice was written before reasons were)"
			case found && omitted > 0:
				st.Why = fmt.Sprintf("out (the status lists the first %d pods out by name)", v1alpha1.MaxNotReadyPerPort)
			case found && drainedWhy(&pod, swh.Name, pv.Name) != "":
				st.Why = drainedWhy(&pod, swh.Name, pv.Name) + " (the status does not list it yet)"
			case !found && !agentUp:
				st.Why = "not published: the agent of " + pod.Spec.NodeName + " is not running"
			case !found:
				st.Why = "not published yet (waiting for the first decisive probe result)"
			default:
				st.Why = "not ready yet (probes undecided)"
			}
			if found && ep.Conditions.Terminating != nil && *ep.Conditions.Terminating {
				st.Why += " (terminating)"
			}
			if st.In {
				pv.Ready++
			}
			pv.Pods = append(pv.Pods, st)
		}
		sort.Slice(pv.Pods, func(i, j int) bool { return pv.Pods[i].Pod < pv.Pods[j].Pod })
		r.Ports = append(r.Ports, pv)
	}
	return r
}

// podAddresses are the pod's addresses, primary first.
func podAddresses(pod *corev1.Pod) []string {
	var out []string
	for _, ip := range pod.Status.PodIPs {
		if ip.IP != "" && !slices.Contains(out, ip.IP) {
			out = append(out, ip.IP)
		}
	}
	if len(out) == 0 && pod.Status.PodIP != "" {
		out = append(out, pod.Status.PodIP)
	}
	return out
}

// findEndpoint finds the pod's endpoint in the resource's slices of the port.
func findEndpoint(slcs []discoveryv1.EndpointSlice, resource, port, ip string) (discoveryv1.Endpoint, int32, bool) {
	for _, s := range slcs {
		if s.Labels[wellknown.LabelResource] != resource || s.Labels[wellknown.LabelPort] != port {
			continue
		}
		for _, e := range s.Endpoints {
			if slices.Contains(e.Addresses, ip) {
				var num int32
				if len(s.Ports) > 0 && s.Ports[0].Port != nil {
					num = *s.Ports[0].Port
				}
				return e, num, true
			}
		}
	}
	return discoveryv1.Endpoint{}, 0, false
}

// statusReasons are the pods the resource's status lists out of port (by name, with their
// reasons), and how many more are out.
func statusReasons(swh *v1alpha1.ServiceWithHealthchecks, port string) (map[string]string, int32) {
	for _, ps := range swh.Status.Ports {
		if ps.Name != port {
			continue
		}
		out := make(map[string]string, len(ps.NotReady))
		for _, e := range ps.NotReady {
			out[e.Pod] = e.Reason
		}
		return out, ps.NotReadyOmitted
	}
	return nil, 0
}
