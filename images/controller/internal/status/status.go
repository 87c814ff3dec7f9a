// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package status computes the status of a ServiceWithHealthchecks from what the controller
// observed. It is a pure function; the reconciler writes the result only when it differs from
// the status the resource already has.
package status

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
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
