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
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
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
	Results scheduler.Results
	// Budget is how many of the resource's targets the node's probe budget allows.
	Budget Budget
	// MaxEndpointsPerSlice is how many endpoints one slice holds before its group is split
	// into chunks (0: sliceplan.DefaultMaxEndpointsPerSlice).
	MaxEndpointsPerSlice int
	// Now is when the reconcile observed: the trigger time of a write no probe result caused
	// (sliceplan.StampTriggers). Zero stamps nothing (tests of a plan's content).
	Now time.Time
}

// Budget is how many of a resource's targets, in the order Decide lists them (pods by name,
// then probes), the node's probe budget allows (development/AGENT.md, "Probe budget").
type Budget struct {
	// Limited is false when the scheduler has no allowance for the resource yet: every target
	// is within budget.
	Limited bool
	// Allowed is how many targets are; those after them are over budget.
	Allowed int
}

// ReasonOverBudget is the failure of a probe that is not run because its target is over the
// node's probe budget: its port is published not serving (fail-safe: nothing checks it).
const ReasonOverBudget = "not probed: over this node's probe budget (see the resource's ProbeBudgetExceeded condition)"

// over tells whether the target at position i of the resource's targets is over budget.
func (b Budget) over(i int) bool { return b.Limited && i >= b.Allowed }

// Decision is what one reconcile does, decided before anything is written.
type Decision struct {
	// Targets are the probes the scheduler runs for the resource on this node, those over
	// budget included (the scheduler keeps the first Allowed).
	Targets []scheduler.Target
	// Allowed is how many of Targets are in budget (set by the reconciler's decide).
	Allowed int
	// SecretRefs are the credential Secrets its probes reference (none while the resource has
	// no pod on this node: nothing to probe, no Secret to watch).
	SecretRefs []types.NamespacedName
	// Desired are the slices of (resource, node) as they should be, and Plan the writes that
	// get there.
	Desired []sliceplan.Desired
	Plan    sliceplan.Plan
	// Transitions are, by desired slice name, the changes of a probed port of a pod between
	// serving and not serving, and the drains and undrains of a pod's port, that the slice
	// carries: recorded as Events once the slice is written, not before.
	Transitions map[string][]Transition
}

// Transition is a probed port of a pod turning serving or not serving, or a port of a pod
// drained or undrained (Drain).
type Transition struct {
	// Pod is the pod (its reference, the Event's related object).
	Pod corev1.ObjectReference
	// Port names the port (its name, or its number when unnamed); "" for a resource without
	// ports.
	Port string
	// Serving is the new verdict; Reason says why it is not serving.
	Serving bool
	Reason  string
	// Drain tells a drain transition from a verdict transition (DrainNone).
	Drain DrainChange
	// Drained tells that the pod is drained from the port (its Event says it stays out).
	Drained bool
}

// DrainChange is what a drain transition does to a port of a pod.
type DrainChange uint8

// The drain transitions: none (a verdict transition), the port drained (taken out of new
// connections by the pod's annotation) or undrained (published on its verdict again).
const (
	DrainNone DrainChange = iota
	DrainStarted
	DrainEnded
)

// Decide is the agent's reconcile of one resource on its node as a pure function: one binding
// per pod (portrule.Bind) gives both the probe targets and, with the current results, the
// per-port verdicts; the verdicts give the desired slices, their diff against the existing ones
// gives the plan, and the verdicts that differ from what the existing slices carry are the
// transitions to report. While the child Service is not the resource's own (the controller's
// status says so: Status.ServiceOwned), nothing is published.
func Decide(o Observed) Decision {
	swh := o.Resource
	ps := newProbeSchedule(swh)
	d := Decision{Targets: make([]scheduler.Target, 0, len(o.Pods)*len(ps.probes))}
	pods := make([]sliceplan.Pod, 0, len(o.Pods))
	// The decided verdicts by pod and port: slot i*slotsPerPod+port of pod i (portSlot).
	slotsPerPod := max(1, len(swh.Spec.Ports))
	verdicts := make([]verdict, len(o.Pods)*slotsPerPod)
	// One results buffer for every pod: Evaluate does not keep it. One endpoints buffer for
	// every pod: each pod's endpoints are a window of it, which sliceplan reads and copies.
	results := make(portrule.Results, len(ps.probes))
	endpoints := make([]portrule.Endpoint, 0, len(o.Pods)*slotsPerPod)
	binder := portrule.NewBinder(&swh.Spec, len(o.Pods))
	for pi, pod := range o.Pods {
		b := binder.Bind(&swh.Spec, pod)
		clear(results)
		if b.Publishable {
			d.Targets = ps.appendTargets(d.Targets, pod, &b, o.Results, o.Budget, results)
		}
		first := len(endpoints)
		endpoints = b.AppendEvaluate(endpoints, &swh.Spec, results)
		eps := endpoints[first:len(endpoints):len(endpoints)]
		// Rule 8: the pod's drain annotation (its problems are the pod watch's to report).
		if _, ok := pod.Annotations[wellknown.AnnotationDrain]; ok {
			drain, _ := portrule.DrainOf(pod)
			portrule.ApplyDrain(eps, swh.Name, &swh.Spec, drain)
		}
		pods = append(pods, sliceplan.Pod{Pod: pod, Endpoints: eps})
		setVerdicts(verdicts[pi*slotsPerPod:(pi+1)*slotsPerPod], eps)
	}
	if len(o.Pods) > 0 {
		d.SecretRefs = secretRefs(swh)
	}

	existing, own := existingSlices(o)
	if !swh.Status.ServiceOwned() {
		// The Service of that name is not this resource's (foreign, left by a deleted resource,
		// or not created yet): a slice labelled with its name would add pods to it (DESIGN §8).
		// Nothing is published and what was published goes; the probes keep running, so the
		// endpoints are decided when the Service becomes this resource's.
		pods = nil
	}
	d.Desired = sliceplan.Compute(sliceplan.Input{Resource: swh, Node: o.Node, Zone: o.Zone, Pods: pods, Existing: own, MaxEndpointsPerSlice: o.MaxEndpointsPerSlice})
	d.Plan = sliceplan.Diff(swh.Name, swh.UID, o.Node, d.Desired, existing)
	if !o.Now.IsZero() {
		sliceplan.StampTriggers(&d.Plan, d.Desired, existing, o.Now)
	}
	// Transitions are reported with the slices that carry them once those are written: without
	// a slice to create or update there is nothing to report them with (the steady state).
	if len(d.Plan.Create)+len(d.Plan.Update) > 0 {
		d.Transitions = transitions(swh, o.Pods, d.Desired, own, verdicts)
	}
	return d
}

// probeSchedule is what every target of a resource shares: its probes, their digests (each
// probe is digested once per reconcile, not once per pod), the period and the initial delay.
type probeSchedule struct {
	res                  types.NamespacedName
	probes               []v1alpha1.Probe
	digests              []scheduler.ProbeDigest
	period, initialDelay time.Duration
}

func newProbeSchedule(swh *v1alpha1.ServiceWithHealthchecks) probeSchedule {
	ps := probeSchedule{res: types.NamespacedName{Namespace: swh.Namespace, Name: swh.Name}}
	if hc := swh.Spec.Healthcheck; hc != nil {
		ps.probes = hc.Probes
		ps.period = time.Duration(max(hc.PeriodSeconds, 1)) * time.Second
		ps.initialDelay = time.Duration(hc.InitialDelaySeconds) * time.Second
	}
	ps.digests = make([]scheduler.ProbeDigest, len(ps.probes))
	for i, p := range ps.probes {
		ps.digests[i] = scheduler.DigestProbe(p)
	}
	return ps
}

// appendTargets appends to targets those of a publishable pod's runnable probes (b is the
// pod's binding) and puts their current results into results: a Fail for those over budget.
func (ps probeSchedule) appendTargets(targets []scheduler.Target, pod *corev1.Pod, b *portrule.Binding, current scheduler.Results, budget Budget, results portrule.Results) []scheduler.Target {
	notBefore := pod.CreationTimestamp.Add(ps.initialDelay)
	if pod.Status.StartTime != nil {
		notBefore = pod.Status.StartTime.Add(ps.initialDelay)
	}
	for i, pb := range b.Probes {
		if !pb.Runnable {
			continue
		}
		t := scheduler.Target{
			Key:       scheduler.NewKey(ps.res, pod.UID, i, ps.digests[i], b.Address, pb.Port, ps.period),
			Probe:     ps.probes[i],
			Namespace: pod.Namespace,
			PodName:   pod.Name,
			PodIP:     b.Address,
			Port:      pb.Port,
			NotBefore: notBefore,
			Period:    ps.period,
		}
		if budget.over(len(targets)) {
			results[i] = portrule.ProbeResult{State: portrule.Fail, Reason: ReasonOverBudget}
			targets = append(targets, t)
			continue
		}
		targets = append(targets, t)
		if r, ok := current.Of(t.Key); ok {
			results[i] = r
		}
	}
	return targets
}

// existingSlices are the observed slices by name, and those of them this agent published for
// the resource on its node.
func existingSlices(o Observed) (map[string]*discoveryv1.EndpointSlice, []*discoveryv1.EndpointSlice) {
	existing := make(map[string]*discoveryv1.EndpointSlice, len(o.Slices))
	var own []*discoveryv1.EndpointSlice
	for _, s := range o.Slices {
		existing[s.Name] = s
		if slicemeta.IsManaged(s) && slicemeta.ResourceOf(s) == o.Resource.Name && slicemeta.NodeOf(s) == o.Node {
			own = append(own, s)
		}
	}
	return existing, own
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
		if p.MySQL != nil && p.MySQL.AuthSecretName != "" {
			out = append(out, types.NamespacedName{Namespace: swh.Namespace, Name: p.MySQL.AuthSecretName})
		}
	}
	return out
}
