// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/scheduler"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/sliceplan"
)

// Observed is everything one reconcile of a resource on this node decides from. observe fills
// it from the caches and the scheduler; Decide reads nothing else.
type Observed struct {
	// Resource is the live resource (not being deleted).
	Resource *v1alpha1.ServiceWithHealthchecks
	// Node is this agent's node; Zone is its topology.kubernetes.io/zone label.
	Node, Zone string
	// Pods are the pods of this node that the resource selects, sorted by name.
	Pods []*corev1.Pod
	// Slices are this module's slices in the resource's namespace whose names start with the
	// resource's name and a dash: the slices this agent published for (resource, node) and
	// every other one that holds a name the resource's slices may take.
	Slices []*discoveryv1.EndpointSlice
	// Results are the scheduler's thresholded results of the resource's targets.
	Results map[scheduler.Key]portrule.ProbeResult
}

// Decision is what one reconcile does, decided before anything is written.
type Decision struct {
	// Targets are the probes the scheduler runs for the resource on this node.
	Targets []scheduler.Target
	// SecretRefs are the credential Secrets its probes reference (none while the resource has
	// no pod on this node: nothing to probe, no Secret to watch).
	SecretRefs []types.NamespacedName
	// Desired are the slices of (resource, node) as they should be, and Plan the writes that
	// get there.
	Desired []sliceplan.Desired
	Plan    sliceplan.Plan
	// Transitions are, by desired slice name, the changes of a probed port of a pod between
	// serving and not serving that the slice carries: recorded as Events once the slice is
	// written, not before.
	Transitions map[string][]Transition
}

// Transition is a probed port of a pod turning serving or not serving.
type Transition struct {
	// Pod is the pod (its reference, the Event's related object).
	Pod corev1.ObjectReference
	// Port names the port (its name, or its number when unnamed); "" for a resource without
	// ports.
	Port string
	// Serving is the new verdict; Reason says why it is not serving.
	Serving bool
	Reason  string
}

// Decide is the agent's reconcile of one resource on its node as a pure function: one binding
// per pod (portrule.Bind) gives both the probe targets and, with the current results, the
// per-port verdicts; the verdicts give the desired slices, their diff against the existing ones
// gives the plan, and the verdicts that differ from what the existing slices carry are the
// transitions to report. While the child Service is not the resource's own (the controller's
// status says so: Status.ServiceOwned), nothing is published.
func Decide(o Observed) Decision {
	swh := o.Resource
	res := types.NamespacedName{Namespace: swh.Namespace, Name: swh.Name}
	var probes []v1alpha1.Probe
	var period, initialDelay time.Duration
	if hc := swh.Spec.Healthcheck; hc != nil {
		probes = hc.Probes
		period = time.Duration(max(hc.PeriodSeconds, 1)) * time.Second
		initialDelay = time.Duration(hc.InitialDelaySeconds) * time.Second
	}
	// Each probe is digested once per reconcile, not once per pod.
	digests := make([]scheduler.ProbeDigest, len(probes))
	for i, p := range probes {
		digests[i] = scheduler.DigestProbe(p)
	}

	d := Decision{Targets: make([]scheduler.Target, 0, len(o.Pods)*len(probes))}
	pods := make([]sliceplan.Pod, 0, len(o.Pods))
	// The verdicts by pod and port: an index into the list (a Transition is too large for a map
	// to hold it without allocating each entry).
	verdicts := make(map[servingKey]int, len(o.Pods)*len(swh.Spec.Ports))
	decided := make([]Transition, 0, len(o.Pods)*len(swh.Spec.Ports))
	// One results buffer for every pod: Evaluate does not keep it.
	results := make(portrule.Results, len(probes))
	for _, pod := range o.Pods {
		b := portrule.Bind(&swh.Spec, pod)
		clear(results)
		if b.Publishable {
			notBefore := pod.CreationTimestamp.Add(initialDelay)
			if pod.Status.StartTime != nil {
				notBefore = pod.Status.StartTime.Add(initialDelay)
			}
			for i, pb := range b.Probes {
				if !pb.Runnable {
					continue
				}
				t := scheduler.Target{
					Key:       scheduler.NewKey(res, pod.UID, i, digests[i], b.Address, pb.Port, period),
					Probe:     probes[i],
					Namespace: pod.Namespace,
					PodName:   pod.Name,
					PodIP:     b.Address,
					Port:      pb.Port,
					NotBefore: notBefore,
					Period:    period,
				}
				d.Targets = append(d.Targets, t)
				if r, ok := o.Results[t.Key]; ok {
					results[i] = r
				}
			}
		}
		eps := b.Evaluate(&swh.Spec, results)
		pods = append(pods, sliceplan.Pod{Pod: pod, Endpoints: eps})
		for _, e := range eps {
			if !e.Published || !e.Decided || len(e.Probes) == 0 {
				continue
			}
			t := Transition{
				Pod:     corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
				Serving: e.Serving, Reason: e.Reason,
			}
			var portName string
			if e.PortIndex != portrule.NoPort {
				port := swh.Spec.Ports[e.PortIndex]
				portName, t.Port = port.Name, port.DisplayName()
			}
			verdicts[servingKey{port: portName, pod: pod.UID}] = len(decided)
			decided = append(decided, t)
		}
	}
	if len(o.Pods) > 0 {
		d.SecretRefs = secretRefs(swh)
	}

	existing := make(map[string]*discoveryv1.EndpointSlice, len(o.Slices))
	var own []*discoveryv1.EndpointSlice
	for _, s := range o.Slices {
		existing[s.Name] = s
		if slicemeta.IsManaged(s) && slicemeta.ResourceOf(s) == swh.Name && slicemeta.NodeOf(s) == o.Node {
			own = append(own, s)
		}
	}
	if !swh.Status.ServiceOwned() {
		// The Service of that name is not this resource's (foreign, left by a deleted resource,
		// or not created yet): a slice labelled with its name would add pods to it (DESIGN §8).
		// Nothing is published and what was published goes; the probes keep running, so the
		// endpoints are decided when the Service becomes this resource's.
		pods = nil
	}
	d.Desired = sliceplan.Compute(sliceplan.Input{Resource: swh, Node: o.Node, Zone: o.Zone, Pods: pods, Existing: own})
	d.Plan = sliceplan.Diff(swh.Name, swh.UID, o.Node, d.Desired, existing)
	d.Transitions = transitions(d.Desired, own, verdicts, decided)
	return d
}

// servingKey is a pod on a port (by port name, "" for a single unnamed port).
type servingKey struct {
	port string
	pod  types.UID
}

// transitions compares the decided verdicts of probed ports with what the existing slices of
// (resource, node) carry. A verdict that differs, or a failing verdict the slices never carried,
// is a transition; it is reported with the first desired slice that lists the pod on that port
// (a dual-stack pod is in one slice per family: it is reported once). A pod that appears
// serving is not a transition: only a change back to serving is ("probes pass").
func transitions(desired []sliceplan.Desired, existing []*discoveryv1.EndpointSlice, verdicts map[servingKey]int, decided []Transition) map[string][]Transition {
	before := make(map[servingKey]bool, len(verdicts))
	for _, s := range existing {
		port, _ := slicemeta.PortOf(s)
		for _, e := range s.Endpoints {
			if e.TargetRef == nil {
				continue
			}
			k := servingKey{port: port, pod: e.TargetRef.UID}
			before[k] = before[k] || e.Conditions.Serving == nil || *e.Conditions.Serving
		}
	}
	out := map[string][]Transition{}
	reported := make(map[servingKey]bool, len(verdicts))
	for _, ds := range desired {
		for _, e := range ds.Slice.Endpoints {
			if e.TargetRef == nil {
				continue
			}
			k := servingKey{port: ds.Key.Port, pod: e.TargetRef.UID}
			i, ok := verdicts[k]
			if !ok || reported[k] {
				continue
			}
			v := decided[i]
			reported[k] = true
			was, seen := before[k]
			switch {
			case seen && was == v.Serving:
			case v.Serving && !seen:
			default:
				out[ds.Slice.Name] = append(out[ds.Slice.Name], v)
			}
		}
	}
	return out
}

// secretRefs are the credential Secrets the probes of a resource reference.
func secretRefs(swh *v1alpha1.ServiceWithHealthchecks) []types.NamespacedName {
	if swh.Spec.Healthcheck == nil {
		return nil
	}
	var out []types.NamespacedName
	for _, p := range swh.Spec.Healthcheck.Probes {
		if p.PostgreSQL != nil && p.PostgreSQL.AuthSecretName != "" {
			out = append(out, types.NamespacedName{Namespace: swh.Namespace, Name: p.PostgreSQL.AuthSecretName})
		}
	}
	return out
}
