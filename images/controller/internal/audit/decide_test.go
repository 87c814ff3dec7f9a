// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func pod(name, uid, nodeName, ip string, podLabels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(uid), Labels: podLabels},
		Spec:       corev1.PodSpec{NodeName: nodeName},
		Status:     corev1.PodStatus{PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}, {IP: "fd00::5"}}},
	}
}

func ep(addr, podName, uid string, mutate ...func(*discoveryv1.Endpoint)) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{
		Addresses:  []string{addr},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true)},
		NodeName:   ptr.To("node-a"),
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: podName, UID: types.UID(uid)},
	}
	for _, m := range mutate {
		m(&e)
	}
	return e
}

func TestDecide(t *testing.T) {
	web := pod("web-1", "uid-1", "node-a", "10.0.0.5", map[string]string{"app": "web", "x": "y"})
	other := pod("db-1", "uid-2", "node-a", "10.0.0.6", map[string]string{"app": "db"})
	moved := pod("web-2", "uid-3", "node-b", "10.0.0.7", map[string]string{"app": "web"})
	pods := map[string]*corev1.Pod{"web-1": web, "db-1": other, "web-2": moved}
	withdrawn := func(e *discoveryv1.Endpoint) {
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false)}
	}
	tests := []struct {
		name     string
		endpoint discoveryv1.Endpoint
		selector map[string]string
		want     string
	}{
		{"honest", ep("10.0.0.5", "web-1", "uid-1"), nil, ""},
		{"honest on its second IP", ep("fd00::5", "web-1", "uid-1"), nil, ""},
		{"ready unset routes", ep("10.9.9.9", "web-1", "uid-1", func(e *discoveryv1.Endpoint) { e.Conditions.Ready = nil }), nil, "address 10.9.9.9 is not an IP of pod web-1"},
		{"serving only routes", ep("10.9.9.9", "web-1", "uid-1", func(e *discoveryv1.Endpoint) { e.Conditions.Ready = ptr.To(false) }), nil, "address 10.9.9.9 is not an IP of pod web-1"},
		{"withdrawn routes nothing", ep("10.9.9.9", "nobody", "u", withdrawn), nil, ""},
		{"no targetRef", ep("10.0.0.5", "web-1", "uid-1", func(e *discoveryv1.Endpoint) { e.TargetRef = nil }), nil, "no targetRef"},
		{"targetRef not a Pod", ep("10.0.0.5", "web-1", "uid-1", func(e *discoveryv1.Endpoint) { e.TargetRef.Kind = "Node" }), nil, "targetRef is not a Pod of this namespace"},
		{"targetRef of another namespace", ep("10.0.0.5", "web-1", "uid-1", func(e *discoveryv1.Endpoint) { e.TargetRef.Namespace = "kube-system" }), nil, "targetRef is not a Pod of this namespace"},
		{"targetRef without a namespace", ep("10.0.0.5", "web-1", "uid-1", func(e *discoveryv1.Endpoint) { e.TargetRef.Namespace = "" }), nil, ""},
		{"pod does not exist", ep("10.0.0.5", "nobody", "u"), nil, "pod nobody does not exist"},
		{"another UID", ep("10.0.0.5", "web-1", "uid-old"), nil, "pod web-1 has UID uid-1, not uid-old"},
		{"no address", ep("", "web-1", "uid-1", func(e *discoveryv1.Endpoint) { e.Addresses = nil }), nil, "the endpoint of pod web-1 has no address"},
		{"wrong address", ep("10.9.9.9", "web-1", "uid-1"), nil, "address 10.9.9.9 is not an IP of pod web-1"},
		{"pod on another node", ep("10.0.0.7", "web-2", "uid-3"), nil, "pod web-2 runs on node node-b, not node-a"},
		{"endpoint names another node", ep("10.0.0.5", "web-1", "uid-1", func(e *discoveryv1.Endpoint) { e.NodeName = ptr.To("node-c") }), nil, "the endpoint of pod web-1 names node node-c, not node-a"},
		{"endpoint names no node", ep("10.0.0.5", "web-1", "uid-1", func(e *discoveryv1.Endpoint) { e.NodeName = nil }), nil, "the endpoint of pod web-1 names no node"},
		{"not selected", ep("10.0.0.6", "db-1", "uid-2"), nil, "the resource does not select pod db-1"},
		{"empty selector selects nothing", ep("10.0.0.5", "web-1", "uid-1"), map[string]string{}, "the resource does not select pod web-1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sel := tc.selector
			if sel == nil {
				sel = map[string]string{"app": "web"}
			}
			in := Input{Namespace: "ns", Node: "node-a", Selector: sel, Pods: pods,
				Endpoints: []discoveryv1.Endpoint{ep("10.0.0.5", "web-1", "uid-1"), tc.endpoint}}
			got := Decide(in)
			if tc.want == "" {
				assert.Empty(t, got)
				return
			}
			n := 1
			if len(sel) == 0 {
				n = 2 // The honest endpoint beside it is not selected either.
			}
			if assert.Len(t, got, n) {
				last := got[n-1]
				assert.Equal(t, tc.want, last.Reason)
				if len(tc.endpoint.Addresses) > 0 {
					assert.Equal(t, tc.endpoint.Addresses[0], last.Address)
				}
			}
		})
	}
}

func TestPodRefs(t *testing.T) {
	withdrawn := ep("10.0.0.9", "gone", "u", func(e *discoveryv1.Endpoint) {
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false)}
	})
	foreign := ep("10.0.0.8", "x", "u", func(e *discoveryv1.Endpoint) { e.TargetRef.Namespace = "other" })
	got := PodRefs("ns", []discoveryv1.Endpoint{ep("1", "a", "u"), ep("2", "a", "u"), ep("3", "b", "u"), withdrawn, foreign})
	assert.Equal(t, []string{"a", "b"}, got)
}

func TestSuspects(t *testing.T) {
	refs := []string{"a", "b", "c"}
	tests := []struct {
		name   string
		forged []Forged
		want   []string
	}{
		{"none", nil, nil},
		{"each pod once", []Forged{{Address: "1", Pod: "a"}, {Address: "2", Pod: "a"}, {Address: "3", Pod: "c"}}, []string{"a", "c"}},
		{"no targetRef is not read", []Forged{{Address: "1"}}, nil},
		{"a pod of another namespace is not read", []Forged{{Address: "1", Pod: "x"}}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, suspects(tc.forged, refs))
		})
	}
}

func TestConfirmer(t *testing.T) {
	const w = time.Second
	t0 := time.Unix(1000, 0)
	name := types.NamespacedName{Namespace: "ns", Name: "s"}
	a := Forged{Address: "10.0.0.1", Pod: "p", Reason: "r"}
	b := Forged{Address: "10.0.0.2", Pod: "p", Reason: "r"}
	tests := []struct {
		name      string
		steps     []func(c *confirmer) ([]Forged, time.Duration)
		confirmed int
		wait      time.Duration
	}{
		{"first sight waits a window", []func(*confirmer) ([]Forged, time.Duration){
			func(c *confirmer) ([]Forged, time.Duration) { return c.observe(name, "u1", []Forged{a}, t0) },
		}, 0, w},
		{"a mismatch that lasts a window is confirmed", []func(*confirmer) ([]Forged, time.Duration){
			func(c *confirmer) ([]Forged, time.Duration) { return c.observe(name, "u1", []Forged{a}, t0) },
			func(c *confirmer) ([]Forged, time.Duration) { return c.observe(name, "u1", []Forged{a}, t0.Add(w)) },
		}, 1, 0},
		{"a clean audit in between resets", []func(*confirmer) ([]Forged, time.Duration){
			func(c *confirmer) ([]Forged, time.Duration) { return c.observe(name, "u1", []Forged{a}, t0) },
			func(c *confirmer) ([]Forged, time.Duration) { return c.observe(name, "u1", nil, t0.Add(w/2)) },
			func(c *confirmer) ([]Forged, time.Duration) { return c.observe(name, "u1", []Forged{a}, t0.Add(w)) },
		}, 0, w},
		{"a rewrite keeping the forged endpoint does not reset", []func(*confirmer) ([]Forged, time.Duration){
			func(c *confirmer) ([]Forged, time.Duration) { return c.observe(name, "u1", []Forged{a}, t0) },
			func(c *confirmer) ([]Forged, time.Duration) {
				return c.observe(name, "u1", []Forged{a, b}, t0.Add(w/2))
			},
			func(c *confirmer) ([]Forged, time.Duration) { return c.observe(name, "u1", []Forged{a, b}, t0.Add(w)) },
		}, 1, 0},
		{"a forger rotating addresses is caught by the slice's window", []func(*confirmer) ([]Forged, time.Duration){
			func(c *confirmer) ([]Forged, time.Duration) { return c.observe(name, "u1", []Forged{a}, t0) },
			func(c *confirmer) ([]Forged, time.Duration) {
				return c.observe(name, "u1", []Forged{b}, t0.Add(w*9/10))
			},
			func(c *confirmer) ([]Forged, time.Duration) {
				return c.observe(name, "u1", []Forged{a}, t0.Add(w*18/10))
			},
			func(c *confirmer) ([]Forged, time.Duration) {
				return c.observe(name, "u1", []Forged{b}, t0.Add(w*27/10))
			},
			func(c *confirmer) ([]Forged, time.Duration) { return c.observe(name, "u1", []Forged{a}, t0.Add(w*3)) },
		}, 1, 0},
		{"a new slice of the same name starts afresh", []func(*confirmer) ([]Forged, time.Duration){
			func(c *confirmer) ([]Forged, time.Duration) { return c.observe(name, "u1", []Forged{a}, t0) },
			func(c *confirmer) ([]Forged, time.Duration) { return c.observe(name, "u2", []Forged{a}, t0.Add(w)) },
		}, 0, w},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newConfirmer(w)
			var got []Forged
			var wait time.Duration
			for _, s := range tc.steps {
				got, wait = s(c)
			}
			assert.Len(t, got, tc.confirmed)
			assert.Equal(t, tc.wait, wait)
		})
	}
}
