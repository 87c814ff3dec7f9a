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
}

// Forged is one endpoint that fails the audit.
type Forged struct {
	// Address is the endpoint's first address ("" when it has none).
	Address string
	// Pod is the name its targetRef gives ("" when it has none).
	Pod string
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

// PodRefs are the names of the Pods of the namespace that the routing endpoints' targetRefs
// name: the Pods Decide needs.
func PodRefs(namespace string, endpoints []discoveryv1.Endpoint) []string {
	var out []string
	for i := range endpoints {
		e := &endpoints[i]
		if Routes(e) && isPodOf(e, namespace) && !slices.Contains(out, e.TargetRef.Name) {
			out = append(out, e.TargetRef.Name)
		}
	}
	return out
}

// suspects are the names among refs of the Pods that forged endpoints name, each once: the
// Pods to read again before deciding.
func suspects(forged []Forged, refs []string) []string {
	var out []string
	for _, f := range forged {
		if slices.Contains(refs, f.Pod) && !slices.Contains(out, f.Pod) {
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

// Decide returns the routing endpoints of in that fail a check, each with the first check it
// fails. It is pure: the caller reads the Pods.
func Decide(in Input) []Forged {
	var out []Forged
	for i := range in.Endpoints {
		e := &in.Endpoints[i]
		if !Routes(e) {
			continue
		}
		if reason := check(in, e); reason != "" {
			f := Forged{Reason: reason}
			if len(e.Addresses) > 0 {
				f.Address = e.Addresses[0]
			}
			if e.TargetRef != nil {
				f.Pod = e.TargetRef.Name
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
