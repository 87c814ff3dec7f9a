// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package status

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// ep is an endpoint with one address; ready nil leaves the condition unset.
func ep(addr string, ready *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
}

// portless is a slice of resource "r" without ports (a headless resource without ports).
func portless(node string, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
	k := slicemeta.SliceKey{Resource: "r", Node: node}
	return discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: k.Name(), Labels: k.Labels()}, Endpoints: eps}
}

// sl is a slice of resource "r" for port on node, with target port number.
func sl(port, node string, number int32, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
	k := slicemeta.SliceKey{Resource: "r", Port: port, Node: node}
	return discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: k.Name(), Labels: k.Labels()},
		Endpoints:  eps,
		Ports:      []discoveryv1.EndpointPort{{Name: ptr.To(port), Port: ptr.To(number)}},
	}
}

// slFamily is a slice of resource "r" for port on node in the address family, target port 8080.
func slFamily(port, node string, family discoveryv1.AddressType, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
	s := sl(port, node, 8080, eps...)
	s.AddressType = family
	s.Name = slicemeta.SliceKey{Resource: "r", Port: port, Node: node, AddressType: family}.Name()
	return s
}

// podEp is an endpoint of the pod name with one address.
func podEp(name, addr string, ready *bool) discoveryv1.Endpoint {
	e := ep(addr, ready)
	e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}
	return e
}

func resource(name string, ports ...v1alpha1.ServicePort) *v1alpha1.ServiceWithHealthchecks {
	return &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Generation: 1},
		Spec:       v1alpha1.ServiceWithHealthchecksSpec{Ports: ports},
	}
}

var (
	web  = v1alpha1.ServicePort{Name: "web", Port: 80}
	smtp = v1alpha1.ServicePort{Name: "smtp", Port: 25}
)

func TestComputeEndpoints(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	synced := metav1.Condition{Status: metav1.ConditionTrue, Reason: "Synced", Message: "ok"}
	yes, no := ptr.To(true), ptr.To(false)
	tests := map[string]struct {
		resource  *v1alpha1.ServiceWithHealthchecks
		slices    []discoveryv1.EndpointSlice
		synced    metav1.Condition
		ports     []v1alpha1.PortStatus
		summary   string
		available metav1.ConditionStatus
		ready     metav1.ConditionStatus
		reason    string
		message   string
	}{
		"two named ports are counted across nodes and the summary names them": {
			resource: resource("r", web, smtp),
			slices: []discoveryv1.EndpointSlice{
				sl("web", "n1", 8080, ep("10.0.0.1", yes), ep("10.0.0.2", no)),
				sl("web", "n2", 8080, ep("10.0.0.3", yes)),
				sl("smtp", "n1", 2525, ep("10.0.0.1", yes), ep("10.0.0.2", no)),
				sl("smtp", "n2", 2525, ep("10.0.0.3", no)),
			},
			synced: synced,
			ports: []v1alpha1.PortStatus{
				// Endpoints that name no pod are counted out, not listed.
				{Name: "web", Port: 80, ReadyEndpoints: 2, TotalEndpoints: 3, NotReadyOmitted: 1},
				{Name: "smtp", Port: 25, ReadyEndpoints: 1, TotalEndpoints: 3, NotReadyOmitted: 2},
			},
			summary: "web 2/3, smtp 1/3", available: metav1.ConditionTrue, ready: metav1.ConditionTrue, reason: ReasonReady,
		},
		"a single unnamed port is summarised by its counts alone, an unset ready counts as ready": {
			resource: resource("r", v1alpha1.ServicePort{Port: 80}),
			slices: []discoveryv1.EndpointSlice{
				sl("", "n1", 8080, ep("10.0.0.1", nil), ep("10.0.0.2", no), ep("10.0.0.3", yes)),
			},
			synced:  synced,
			ports:   []v1alpha1.PortStatus{{Port: 80, ReadyEndpoints: 2, TotalEndpoints: 3, NotReadyOmitted: 1}},
			summary: "2/3", available: metav1.ConditionTrue, ready: metav1.ConditionTrue, reason: ReasonReady,
		},
		"an endpoint listed in two slices of a port is counted once, ready when either says so": {
			resource: resource("r", web),
			slices: []discoveryv1.EndpointSlice{
				sl("web", "n1", 8080, ep("10.0.0.1", no)),
				sl("web", "n1-copy", 8080, ep("10.0.0.1", yes)),
				// Another target port number of the same address is another endpoint.
				sl("web", "n1", 8081, ep("10.0.0.1", no)),
			},
			synced:  synced,
			ports:   []v1alpha1.PortStatus{{Name: "web", Port: 80, ReadyEndpoints: 1, TotalEndpoints: 2, NotReadyOmitted: 1}},
			summary: "web 1/2", available: metav1.ConditionTrue, ready: metav1.ConditionTrue, reason: ReasonReady,
		},
		"a dual-stack pod is in a slice per family and counts once": {
			resource: resource("r", web),
			slices: []discoveryv1.EndpointSlice{
				slFamily("web", "n1", discoveryv1.AddressTypeIPv4, podEp("web-0", "10.0.0.1", yes), podEp("web-1", "10.0.0.2", no)),
				slFamily("web", "n1", discoveryv1.AddressTypeIPv6, podEp("web-0", "fd00::1", yes), podEp("web-1", "fd00::2", no)),
				// An IPv4-only pod is in the IPv4 slice alone, and counts like the others.
				slFamily("web", "n2", discoveryv1.AddressTypeIPv4, podEp("web-2", "10.0.0.3", yes)),
			},
			synced: synced,
			ports: []v1alpha1.PortStatus{{Name: "web", Port: 80, ReadyEndpoints: 2, TotalEndpoints: 3,
				NotReady: []v1alpha1.NotReadyPod{{Pod: "web-1", Node: "n1"}}}},
			summary: "web 2/3", available: metav1.ConditionTrue, ready: metav1.ConditionTrue, reason: ReasonReady,
		},
		"a port without a ready endpoint is named and makes the resource not ready": {
			resource: resource("r", web, smtp),
			slices: []discoveryv1.EndpointSlice{
				sl("web", "n1", 8080, ep("10.0.0.1", yes)),
				sl("smtp", "n1", 2525, ep("10.0.0.1", no)),
			},
			synced: synced,
			ports: []v1alpha1.PortStatus{
				{Name: "web", Port: 80, ReadyEndpoints: 1, TotalEndpoints: 1},
				{Name: "smtp", Port: 25, ReadyEndpoints: 0, TotalEndpoints: 1, NotReadyOmitted: 1},
			},
			summary: "web 1/1, smtp 0/1", available: metav1.ConditionFalse, ready: metav1.ConditionFalse,
			reason: ReasonNoReadyEndpoints, message: "no ready endpoint for port smtp",
		},
		"without slices every port reports zero and is named": {
			resource: resource("r", web, smtp),
			synced:   synced,
			ports: []v1alpha1.PortStatus{
				{Name: "web", Port: 80},
				{Name: "smtp", Port: 25},
			},
			summary: "web 0/0, smtp 0/0", available: metav1.ConditionFalse, ready: metav1.ConditionFalse,
			reason: ReasonNoReadyEndpoints, message: "no ready endpoint for port web, smtp",
		},
		"a resource without ports counts the endpoints of its port-less slices": {
			resource: func() *v1alpha1.ServiceWithHealthchecks { r := resource("r"); r.Spec.ClusterIP = "None"; return r }(),
			slices:   []discoveryv1.EndpointSlice{portless("n1", ep("10.0.0.1", yes), ep("10.0.0.2", no))},
			synced:   synced,
			summary:  "1/2", available: metav1.ConditionTrue, ready: metav1.ConditionTrue,
			reason: ReasonReady,
		},
		"a resource without ports and without a ready endpoint is not available": {
			resource: func() *v1alpha1.ServiceWithHealthchecks { r := resource("r"); r.Spec.ClusterIP = "None"; return r }(),
			slices:   []discoveryv1.EndpointSlice{portless("n1", ep("10.0.0.2", no))},
			synced:   synced,
			summary:  "0/1", available: metav1.ConditionFalse, ready: metav1.ConditionFalse,
			reason: ReasonNoReadyEndpoints, message: "no ready endpoint is published (the resource has no ports)",
		},
		"ready endpoints do not make the resource ready while its Service is not synced": {
			resource: resource("r", web),
			slices:   []discoveryv1.EndpointSlice{sl("web", "n1", 8080, ep("10.0.0.1", yes))},
			synced:   metav1.Condition{Status: metav1.ConditionFalse, Reason: "ForeignService", Message: "not ours"},
			ports:    []v1alpha1.PortStatus{{Name: "web", Port: 80, ReadyEndpoints: 1, TotalEndpoints: 1}},
			summary:  "web 1/1", available: metav1.ConditionTrue, ready: metav1.ConditionFalse,
			reason: ReasonServiceNotSynced, message: "ServiceSynced is not True: not ours",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := Compute(Observed{Resource: tc.resource, ServiceSynced: tc.synced, Slices: tc.slices, Service: &corev1.Service{}, Now: now})
			assert.Equal(t, tc.ports, got.Ports)
			assert.Equal(t, tc.summary, got.ReadySummary)
			available := meta.FindStatusCondition(got.Conditions, v1alpha1.ConditionEndpointsAvailable)
			ready := meta.FindStatusCondition(got.Conditions, v1alpha1.ConditionReady)
			require.NotNil(t, available)
			require.NotNil(t, ready)
			assert.Equal(t, tc.available, available.Status)
			assert.Equal(t, tc.ready, ready.Status)
			assert.Equal(t, tc.reason, ready.Reason)
			if tc.message != "" {
				assert.Equal(t, tc.message, ready.Message)
			}
			assert.Equal(t, int64(1), ready.ObservedGeneration)
			withGot := tc.resource.DeepCopy()
			withGot.Status = got
			again := Compute(Observed{Resource: withGot, ServiceSynced: tc.synced, Slices: tc.slices, Service: &corev1.Service{}, Now: metav1.NewTime(now.Add(time.Hour))})
			assert.False(t, Changed(&got, &again), "computing again from the same world changes nothing")
		})
	}
}

// EndpointsAvailable of a dual-stack resource asks for a ready endpoint in each family of its
// Service: a port ready over IPv4 only is named with the family it lacks.
func TestEndpointsAvailableInEveryFamilyOfTheService(t *testing.T) {
	yes := ptr.To(true)
	r := resource("r", web)
	slices := []discoveryv1.EndpointSlice{slFamily("web", "n1", discoveryv1.AddressTypeIPv4, podEp("web-0", "10.0.0.1", yes))}
	dual := &corev1.Service{Spec: corev1.ServiceSpec{IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}}}
	single := &corev1.Service{Spec: corev1.ServiceSpec{IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}}}
	synced := metav1.Condition{Status: metav1.ConditionTrue, Reason: "Synced", Message: "ok"}

	got := Compute(Observed{Resource: r, ServiceSynced: synced, Slices: slices, Service: dual, Now: metav1.Now()})
	c := meta.FindStatusCondition(got.Conditions, v1alpha1.ConditionEndpointsAvailable)
	require.NotNil(t, c)
	assert.Equal(t, metav1.ConditionFalse, c.Status)
	assert.Equal(t, "no ready endpoint for port web (IPv6)", c.Message)
	assert.Equal(t, "web 1/1", got.ReadySummary, "the counts are pods, whatever the family")

	got = Compute(Observed{Resource: r, ServiceSynced: synced, Slices: slices, Service: single, Now: metav1.Now()})
	c = meta.FindStatusCondition(got.Conditions, v1alpha1.ConditionEndpointsAvailable)
	require.NotNil(t, c)
	assert.Equal(t, metav1.ConditionTrue, c.Status, "a single-stack Service needs its own family only")

	slices = append(slices, slFamily("web", "n1", discoveryv1.AddressTypeIPv6, podEp("web-0", "fd00::1", yes)))
	got = Compute(Observed{Resource: r, ServiceSynced: synced, Slices: slices, Service: dual, Now: metav1.Now()})
	c = meta.FindStatusCondition(got.Conditions, v1alpha1.ConditionEndpointsAvailable)
	require.NotNil(t, c)
	assert.Equal(t, metav1.ConditionTrue, c.Status, "%s", c.Message)
	assert.Equal(t, "web 1/1", got.ReadySummary, "the dual-stack pod counts once")
}

func TestComputeSliceNameConflict(t *testing.T) {
	deleted := resource("a", v1alpha1.ServicePort{Name: "b-c", Port: 80})
	deleted.DeletionTimestamp = ptr.To(metav1.Now())
	otherNS := resource("a", v1alpha1.ServicePort{Name: "b-c", Port: 80})
	otherNS.Namespace = "elsewhere"
	tests := map[string]struct {
		resource   *v1alpha1.ServiceWithHealthchecks
		neighbours []*v1alpha1.ServiceWithHealthchecks
		status     metav1.ConditionStatus
		message    string
	}{
		"a-b port c and a port b-c collide": {
			resource:   resource("a-b", v1alpha1.ServicePort{Name: "c", Port: 80}),
			neighbours: []*v1alpha1.ServiceWithHealthchecks{resource("a", v1alpha1.ServicePort{Name: "b-c", Port: 80}), resource("zzz", web)},
			status:     metav1.ConditionTrue,
			message:    `EndpointSlice names collide on every node, neither resource's slices are overwritten: port c collides with resource a, port b-c`,
		},
		"the other side of the same collision names the first resource": {
			resource:   resource("a", v1alpha1.ServicePort{Name: "b-c", Port: 80}),
			neighbours: []*v1alpha1.ServiceWithHealthchecks{resource("a-b", v1alpha1.ServicePort{Name: "c", Port: 80})},
			status:     metav1.ConditionTrue,
			message:    `EndpointSlice names collide on every node, neither resource's slices are overwritten: port b-c collides with resource a-b, port c`,
		},
		"a single unnamed port collides with a named port of a shorter name": {
			resource:   resource("a-b", v1alpha1.ServicePort{Port: 80}),
			neighbours: []*v1alpha1.ServiceWithHealthchecks{resource("a", v1alpha1.ServicePort{Name: "b", Port: 80})},
			status:     metav1.ConditionTrue,
			message:    `EndpointSlice names collide on every node, neither resource's slices are overwritten: port 80 collides with resource a, port b`,
		},
		"different prefixes do not collide": {
			resource:   resource("a-b", v1alpha1.ServicePort{Name: "c", Port: 80}),
			neighbours: []*v1alpha1.ServiceWithHealthchecks{resource("a", v1alpha1.ServicePort{Name: "b-d", Port: 80})},
			status:     metav1.ConditionFalse,
		},
		"a resource being deleted or in another namespace does not collide": {
			resource:   resource("a-b", v1alpha1.ServicePort{Name: "c", Port: 80}),
			neighbours: []*v1alpha1.ServiceWithHealthchecks{deleted, otherNS},
			status:     metav1.ConditionFalse,
		},
		"the resource itself in the list is no collision": {
			resource:   resource("a-b", v1alpha1.ServicePort{Name: "c", Port: 80}),
			neighbours: []*v1alpha1.ServiceWithHealthchecks{resource("a-b", v1alpha1.ServicePort{Name: "c", Port: 80})},
			status:     metav1.ConditionFalse,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var neighbours []v1alpha1.ServiceWithHealthchecks
			for _, n := range tc.neighbours {
				neighbours = append(neighbours, *n)
			}
			got := Compute(Observed{Resource: tc.resource, Neighbours: neighbours, Now: metav1.Now()})
			c := meta.FindStatusCondition(got.Conditions, v1alpha1.ConditionSliceNameConflict)
			require.NotNil(t, c)
			assert.Equal(t, tc.status, c.Status)
			if tc.message != "" {
				assert.Equal(t, tc.message, c.Message)
			}
		})
	}
}
