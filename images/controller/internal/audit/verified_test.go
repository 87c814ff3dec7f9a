// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestVerifiedFilter: the status sees only endpoints the audit verified; a slice version not
// judged yet is pending (kept whole only once the caller has waited); an endpoint verified at
// an earlier version counts at a later one that says the same of it (a readiness flip).
func TestVerifiedFilter(t *testing.T) {
	web := pod("web-1", "uid-1", "node-a", "10.0.0.5", map[string]string{"app": "web"})
	s := discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", UID: "s1", ResourceVersion: "1"},
		Endpoints:  []discoveryv1.Endpoint{ep("10.0.0.5", "web-1", "uid-1"), ep("10.9.9.9", "ghost", "g")},
	}
	in := Input{Namespace: "ns", Node: "node-a", Selector: map[string]string{"app": "web"}, Endpoints: s.Endpoints,
		Pods: map[string]*corev1.Pod{"web-1": web}, WholeSlice: true}

	v := NewVerified()
	out, pending := v.Filter([]discoveryv1.EndpointSlice{s}, false)
	assert.True(t, pending, "not judged yet")
	assert.Empty(t, out[0].Endpoints)
	out, _ = v.Filter([]discoveryv1.EndpointSlice{s}, true)
	assert.Len(t, out[0].Endpoints, 2, "kept whole once the caller has waited")

	v.record(&s, in, len(Decide(in)) == 0)
	assert.False(t, v.Clean(&s), "a slice with a failing endpoint is not clean")
	assert.True(t, (*Verified)(nil).Clean(&s), "with the audit off every slice is")
	out, pending = v.Filter([]discoveryv1.EndpointSlice{s}, false)
	assert.False(t, pending)
	if assert.Len(t, out[0].Endpoints, 1) {
		assert.Equal(t, "web-1", out[0].Endpoints[0].TargetRef.Name)
	}
	assert.Len(t, s.Endpoints, 2, "the input is untouched")

	flipped := *s.DeepCopy()
	flipped.ResourceVersion = "2"
	flipped.Endpoints[0].Conditions.Ready = ptr.To(false)
	out, pending = v.Filter([]discoveryv1.EndpointSlice{flipped}, false)
	assert.True(t, pending, "a new version is to be judged")
	assert.Len(t, out[0].Endpoints, 1, "but the endpoint verified before still counts")

	replaced := s
	replaced.UID = "s2"
	replaced.ResourceVersion = "1"
	out, _ = v.Filter([]discoveryv1.EndpointSlice{replaced}, false)
	assert.Empty(t, out[0].Endpoints, "another object of the same name is judged afresh")

	var off *Verified
	out, pending = off.Filter([]discoveryv1.EndpointSlice{s}, false)
	assert.False(t, pending)
	assert.Len(t, out[0].Endpoints, 2, "the audit off: everything counts")
}

// TestVerifiedKeepsAStaleNodesWithdrawnEndpoints: the audit of a stale node's slice does not
// judge the endpoints that route nothing (their Pods may be gone with the node): one the
// controller withdrew after verifying it stays verified, so the status counts it out of
// traffic instead of dropping it from its total; one never verified is not, and on a live
// node's slice a not-routing endpoint is judged as any other.
func TestVerifiedKeepsAStaleNodesWithdrawnEndpoints(t *testing.T) {
	web := pod("web-1", "uid-1", "node-a", "10.0.0.5", map[string]string{"app": "web"})
	s := discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", UID: "s1", ResourceVersion: "1"},
		Endpoints:  []discoveryv1.Endpoint{ep("10.0.0.5", "web-1", "uid-1")},
	}
	live := Input{Namespace: "ns", Node: "node-a", Selector: map[string]string{"app": "web"}, Endpoints: s.Endpoints,
		Pods: map[string]*corev1.Pod{"web-1": web}, WholeSlice: true}
	v := NewVerified()
	v.record(&s, live, true)

	// The controller withdraws the endpoint and adds one that was never verified; the node is
	// stale, so the audit reads no Pod for what routes nothing.
	withdrawn := *s.DeepCopy()
	withdrawn.ResourceVersion = "2"
	withdrawn.Endpoints = append(withdrawn.Endpoints, ep("10.0.0.6", "web-2", "uid-2"))
	for i := range withdrawn.Endpoints {
		withdrawn.Endpoints[i].Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false)}
	}
	stale := Input{Namespace: "ns", Node: "node-a", Selector: map[string]string{"app": "web"}, Endpoints: withdrawn.Endpoints}
	v.record(&withdrawn, stale, len(Decide(stale)) == 0)
	out, pending := v.Filter([]discoveryv1.EndpointSlice{withdrawn}, false)
	assert.False(t, pending)
	if assert.Len(t, out[0].Endpoints, 1, "the withdrawn endpoint verified before still counts; the new one does not") {
		assert.Equal(t, "web-1", out[0].Endpoints[0].TargetRef.Name)
	}

	// On a live node's slice the same not-routing endpoint is judged: its Pod gone, it is out.
	again := *withdrawn.DeepCopy()
	again.ResourceVersion = "3"
	judged := Input{Namespace: "ns", Node: "node-a", Selector: map[string]string{"app": "web"}, Endpoints: again.Endpoints, WholeSlice: true}
	v.record(&again, judged, len(Decide(judged)) == 0)
	out, _ = v.Filter([]discoveryv1.EndpointSlice{again}, false)
	assert.Empty(t, out[0].Endpoints, "judged on a live node's slice, a Pod that is gone is not verified")
}
