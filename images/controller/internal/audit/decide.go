// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package audit checks every EndpointSlice of this module against the Pods its endpoints name
// and deletes the slices that publish what no honest agent writes (development/CONTROLLER.md,
// "Audit of published endpoints"). It is shaped observe (Reconcile) → decide (Decide, pure) →
// apply (a SliceDeleter, an Event and a counter).
package audit

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/deckhouse/service-with-healthchecks/api/podport"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// Input is what Decide judges: one slice's endpoints with what they must match.
type Input struct {
	// Namespace is the slice's (and so the resource's and its Pods') namespace.
	Namespace string
	// Node is the node the slice was published for (slicemeta.NodeOf).
	Node string
	// Selector is the resource's Pod selector; an empty one selects nothing.
	Selector map[string]string
	// Endpoints are the slice's endpoints.
	Endpoints []discoveryv1.Endpoint
	// Pods are Pods of the namespace by name, as read from the API server: at least those the
	// endpoints' targetRefs name that exist; a name absent from the map is a Pod that does not.
	Pods map[string]*corev1.Pod
	// Ports are the slice's ports; ServicePort, when set, is the resource's port they publish
	// (nil: the resource has no port of the slice's port label, or the slice is port-less), and
	// each number must be what its target port resolves to on every endpoint's Pod.
	Ports       []discoveryv1.EndpointPort
	ServicePort *v1alpha1.ServicePort
	// WholeSlice audits what routes nothing too (endpoints withdrawn or not ready, and an empty
	// slice): no agent plan names a Pod that is not its node's, nor publishes a slice without
	// endpoints. It is false only for the slices of a node whose agent is judged stale, whose
	// endpoints the controller's withdrawal wrote and whose Pods may be gone with the node.
	WholeSlice bool
}

// Forged is one endpoint that fails the audit.
type Forged struct {
	// Address is the endpoint's first address ("" when it has none).
	Address string
	// Pod and UID are the name and UID its targetRef gives ("" when it has none).
	Pod string
	UID string
	// Reason says which check failed.
	Reason string
}

// Routes tells whether an endpoint can receive traffic: ready (true or unset) or serving. An
// endpoint withdrawn as ready=false, serving=false routes nothing and is not audited.
func Routes(e *discoveryv1.Endpoint) bool {
	ready := e.Conditions.Ready == nil || *e.Conditions.Ready
	serving := e.Conditions.Serving != nil && *e.Conditions.Serving
	return ready || serving
}

// PodRefs are the names of the Pods of the namespace that the endpoints' targetRefs name (the
// routing ones only unless whole): the Pods Decide needs.
func PodRefs(namespace string, endpoints []discoveryv1.Endpoint, whole bool) []string {
	var out []string
	seen := map[string]bool{}
	for i := range endpoints {
		e := &endpoints[i]
		if (whole || Routes(e)) && isPodOf(e, namespace) && !seen[e.TargetRef.Name] {
			seen[e.TargetRef.Name] = true
			out = append(out, e.TargetRef.Name)
		}
	}
	return out
}

// MaxRereads bounds the Pods one audit reads again one by one (suspects): a slice of a
// thousand endpoints naming Pods that do not exist costs the same as one of eight. The rest
// are judged on the LIST read a moment before, and the confirmation window covers a race.
const MaxRereads = 8

// suspects are the names among refs of the Pods that forged endpoints name, each once, at most
// MaxRereads: the Pods to read again before deciding.
func suspects(forged []Forged, refs []string) []string {
	named := make(map[string]bool, len(refs))
	for _, r := range refs {
		named[r] = true
	}
	var out []string
	for _, f := range forged {
		if len(out) == MaxRereads {
			break
		}
		if named[f.Pod] && !slices.Contains(out, f.Pod) {
			out = append(out, f.Pod)
		}
	}
	return out
}

func isPodOf(e *discoveryv1.Endpoint, namespace string) bool {
	ref := e.TargetRef
	return ref != nil && ref.Kind == "Pod" && (ref.APIVersion == "" || ref.APIVersion == "v1") &&
		(ref.Namespace == "" || ref.Namespace == namespace) && ref.Name != ""
}

// ReasonEmpty is the reason given for a slice without endpoints: no agent plan has one (an
// agent deletes a slice, a chunk included, whose endpoints are all gone).
const ReasonEmpty = "the slice has no endpoints (no agent publishes an empty slice)"

// notRoutingPrefix starts the reason of an endpoint that routes nothing (withdrawn or not
// ready) but names no real Pod of the node: no agent publishes it either.
const notRoutingPrefix = "not-ready endpoint: "

// Decide returns the endpoints of in that fail a check, each with the first check it fails:
// those that route traffic always, the others too when in.WholeSlice (then an empty slice
// fails as a whole, with ReasonEmpty and no address or Pod). It is pure: the caller reads the
// Pods.
func Decide(in Input) []Forged {
	var out []Forged
	if in.WholeSlice && len(in.Endpoints) == 0 {
		return []Forged{{Reason: ReasonEmpty}}
	}
	for i := range in.Endpoints {
		e := &in.Endpoints[i]
		routes := Routes(e)
		if !routes && !in.WholeSlice {
			continue
		}
		if reason := check(in, e); reason != "" {
			if !routes {
				reason = notRoutingPrefix + reason
			}
			f := Forged{Reason: reason}
			if len(e.Addresses) > 0 {
				f.Address = e.Addresses[0]
			}
			if e.TargetRef != nil {
				f.Pod = e.TargetRef.Name
				f.UID = string(e.TargetRef.UID)
			}
			out = append(out, f)
		}
	}
	return out
}

// check is the reason endpoint e fails, or "".
func check(in Input, e *discoveryv1.Endpoint) string {
	if e.TargetRef == nil {
		return "no targetRef"
	}
	if !isPodOf(e, in.Namespace) {
		return "targetRef is not a Pod of this namespace"
	}
	name := e.TargetRef.Name
	pod := in.Pods[name]
	if pod == nil {
		return fmt.Sprintf("pod %s does not exist", name)
	}
	if e.TargetRef.UID != pod.UID {
		return fmt.Sprintf("pod %s has UID %s, not %s", name, pod.UID, e.TargetRef.UID)
	}
	if len(e.Addresses) == 0 {
		return fmt.Sprintf("the endpoint of pod %s has no address", name)
	}
	for _, a := range e.Addresses {
		if !hasIP(pod, a) {
			return fmt.Sprintf("address %s is not an IP of pod %s", a, name)
		}
	}
	if pod.Spec.NodeName != in.Node {
		return fmt.Sprintf("pod %s runs on node %s, not %s", name, pod.Spec.NodeName, in.Node)
	}
	if e.NodeName == nil {
		return fmt.Sprintf("the endpoint of pod %s names no node", name)
	}
	if *e.NodeName != in.Node {
		return fmt.Sprintf("the endpoint of pod %s names node %s, not %s", name, *e.NodeName, in.Node)
	}
	if len(in.Selector) == 0 || !labels.SelectorFromSet(in.Selector).Matches(labels.Set(pod.Labels)) {
		return fmt.Sprintf("the resource does not select pod %s", name)
	}
	if p := pod.Status.Phase; p == corev1.PodSucceeded || p == corev1.PodFailed {
		return fmt.Sprintf("pod %s has ended (phase %s)", name, p)
	}
	return checkPorts(in, pod)
}

// checkPorts is the reason the slice's port numbers are not what the resource's port resolves
// to on pod, or "".
func checkPorts(in Input, pod *corev1.Pod) string {
	if in.ServicePort == nil {
		return ""
	}
	sp := in.ServicePort
	for _, p := range in.Ports {
		if p.Port == nil {
			continue
		}
		target := sp.EffectiveTargetPort()
		want, ok := podport.Resolve(pod, target, sp.Protocol)
		if !ok {
			return fmt.Sprintf("pod %s has no container port %s", pod.Name, target.String())
		}
		if *p.Port != want {
			return fmt.Sprintf("port %d is not the target port of pod %s (%d)", *p.Port, pod.Name, want)
		}
	}
	return ""
}

func hasIP(pod *corev1.Pod, addr string) bool {
	if pod.Status.PodIP == addr {
		return addr != ""
	}
	for _, ip := range pod.Status.PodIPs {
		if ip.IP == addr {
			return true
		}
	}
	return false
}
