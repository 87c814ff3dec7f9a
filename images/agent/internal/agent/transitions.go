// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/sliceplan"
)

// verdict is the decided verdict of a pod on a published port.
type verdict struct {
	decided bool
	// probed tells that probes check the port: only their verdicts are serving transitions
	// (an unprobed port follows the pod's Ready condition, which the kubelet reports).
	probed  bool
	serving bool
	reason  string
	// drained, ready and terminating are the port's drain and its published conditions.
	drained, ready, terminating bool
}

// setVerdicts records the decided verdicts of a pod's published endpoints in its slots (one
// per port, portSlot).
func setVerdicts(slots []verdict, eps []portrule.Endpoint) {
	for _, e := range eps {
		if !e.Published || !e.Decided {
			continue
		}
		slot := 0
		if e.PortIndex != portrule.NoPort {
			slot = e.PortIndex
		}
		slots[slot] = verdict{decided: true, probed: len(e.Probes) > 0, serving: e.Serving, reason: e.Reason,
			drained: e.Drained, ready: e.Ready, terminating: e.Terminating}
	}
}

// portSlot is the slot of a port, by name, among a pod's verdicts: its index in spec.ports (0
// for the one endpoint of a resource without ports); ok is false for a port the spec lacks.
func portSlot(swh *v1alpha1.ServiceWithHealthchecks, name string) (int, bool) {
	if len(swh.Spec.Ports) == 0 {
		return 0, name == ""
	}
	for i := range swh.Spec.Ports {
		if swh.Spec.Ports[i].Name == name {
			return i, true
		}
	}
	return 0, false
}

// The conditions of a pod on a port that the existing slices carry (transitions), as bits: a
// dual-stack pod is in one slice per family, and a condition carried in any of them counts.
const (
	carried uint8 = 1 << iota
	carriedReady
	carriedServing
)

// carriedStates are the carried conditions of the pods (by index) on every port slot.
func carriedStates(swh *v1alpha1.ServiceWithHealthchecks, index map[types.UID]int, existing []*discoveryv1.EndpointSlice, n int) []uint8 {
	slotsPerPod := max(1, len(swh.Spec.Ports))
	before := make([]uint8, n)
	for _, s := range existing {
		port, _ := slicemeta.PortOf(s)
		slot, ok := portSlot(swh, port)
		if !ok {
			continue
		}
		for _, e := range s.Endpoints {
			if e.TargetRef == nil {
				continue
			}
			i, ok := index[e.TargetRef.UID]
			if !ok {
				continue
			}
			st := carried
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				st |= carriedReady
			}
			if e.Conditions.Serving == nil || *e.Conditions.Serving {
				st |= carriedServing
			}
			before[i*slotsPerPod+slot] |= st
		}
	}
	return before
}

// servingChanged tells whether a probed port's verdict is a transition from what the slices
// carry: a verdict that differs, or a failing verdict the slices never carried. A pod that
// appears serving is not a transition: only a change back to serving is ("probes pass").
func servingChanged(before uint8, v verdict) bool {
	if !v.probed {
		return false
	}
	was, seen := before&carriedServing != 0, before&carried != 0
	switch {
	case seen && was == v.serving:
		return false
	case v.serving && !seen:
		return false
	}
	return true
}

// drainChanged is the drain transition of a port (DrainNone: none). A drain is reported when it
// changes whether the port takes new connections: a port that would be ready (serving and not
// terminating, or any port of a resource that publishes not-ready addresses) and is drained
// becomes not ready though the slices carried it ready (or not at all); an undrained port
// becomes ready though the slices carried it drained (not ready, and serving or of such a
// resource). The slices carry a drained port terminating (sliceplan publishes a drain so),
// releases before v0.3.0 not terminating: a port ready now is of a pod that is not terminating
// (or of a resource that publishes a terminating pod ready), so a not-ready entry of it was a
// drain either way. Draining a port that is out anyway (failing, terminating) changes nothing
// the slices carry; its Event, when its probes pass, says it stays drained.
func drainChanged(before uint8, v verdict, publishNotReady bool) DrainChange {
	seen := before&carried != 0
	wasOut := seen && before&carriedReady == 0
	switch {
	case v.drained && !v.terminating && (v.serving || publishNotReady) && !wasOut:
		return DrainStarted
	case !v.drained && v.ready && wasOut && (before&carriedServing != 0 || publishNotReady):
		return DrainEnded
	}
	return DrainNone
}

// transitions compares the decided verdicts (by pod of pods and port slot) with what the
// existing slices of (resource, node) carry: the serving transitions of probed ports
// (servingChanged) and the drain transitions of every port (drainChanged). Each is reported with
// the first desired slice that lists the pod on that port (a dual-stack pod is in one slice per
// family: it is reported once). Pods are found by uid once; the rest is indexing.
func transitions(swh *v1alpha1.ServiceWithHealthchecks, pods []*corev1.Pod, desired []sliceplan.Desired, existing []*discoveryv1.EndpointSlice, verdicts []verdict) map[string][]Transition {
	slotsPerPod := max(1, len(swh.Spec.Ports))
	index := make(map[types.UID]int, len(pods))
	for i, p := range pods {
		index[p.UID] = i
	}
	before := carriedStates(swh, index, existing, len(verdicts))
	out := map[string][]Transition{}
	reported := make([]bool, len(verdicts))
	for _, ds := range desired {
		slot, ok := portSlot(swh, ds.Key.Port)
		if !ok {
			continue
		}
		for _, e := range ds.Slice.Endpoints {
			if e.TargetRef == nil {
				continue
			}
			i, ok := index[e.TargetRef.UID]
			if !ok {
				continue
			}
			k := i*slotsPerPod + slot
			v := verdicts[k]
			if !v.decided || reported[k] {
				continue
			}
			reported[k] = true
			pod := pods[i]
			t := Transition{
				Pod:     corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
				Serving: v.serving, Reason: v.reason, Drained: v.drained,
			}
			if len(swh.Spec.Ports) > 0 {
				t.Port = swh.Spec.Ports[slot].DisplayName()
			}
			if servingChanged(before[k], v) {
				out[ds.Slice.Name] = append(out[ds.Slice.Name], t)
			}
			if t.Drain = drainChanged(before[k], v, swh.Spec.PublishNotReadyAddresses); t.Drain != DrainNone {
				out[ds.Slice.Name] = append(out[ds.Slice.Name], t)
			}
		}
	}
	return out
}
