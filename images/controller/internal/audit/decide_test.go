// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
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
	eps := []discoveryv1.Endpoint{ep("1", "a", "u"), ep("2", "a", "u"), ep("3", "b", "u"), withdrawn, foreign}
	assert.Equal(t, []string{"a", "b"}, PodRefs("ns", eps, false))
	assert.Equal(t, []string{"a", "b", "gone"}, PodRefs("ns", eps, true), "the whole slice: what routes nothing too")
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
		{"at most MaxRereads", manyForged(3 * MaxRereads), []string{"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"}},
	}
	for i := range 3 * MaxRereads {
		refs = append(refs, fmt.Sprintf("p%d", i))
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, suspects(tc.forged, refs))
		})
	}
}

func manyForged(n int) []Forged {
	out := make([]Forged, 0, n)
	for i := range n {
		out = append(out, Forged{Address: fmt.Sprintf("10.0.1.%d", i), Pod: fmt.Sprintf("p%d", i)})
	}
	return out
}

// TestDecideWholeSlice: what routes nothing is audited too (an agent publishes not-ready
// endpoints only for real Pods of its node, and no empty slice), except on a node whose agent
// is stale (WholeSlice false: the controller's withdrawal, whose Pods may be gone).
func TestDecideWholeSlice(t *testing.T) {
	web := pod("web-1", "uid-1", "node-a", "10.0.0.5", map[string]string{"app": "web"})
	ended := pod("web-9", "uid-9", "node-a", "10.0.0.9", map[string]string{"app": "web"})
	ended.Status.Phase = corev1.PodFailed
	pods := map[string]*corev1.Pod{"web-1": web, "web-9": ended}
	notReady := func(e *discoveryv1.Endpoint) {
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false)}
	}
	tests := []struct {
		name      string
		endpoints []discoveryv1.Endpoint
		whole     bool
		want      []string
	}{
		{"honest not-ready endpoint", []discoveryv1.Endpoint{ep("10.0.0.5", "web-1", "uid-1", notReady)}, true, nil},
		{"not-ready endpoint naming no pod", []discoveryv1.Endpoint{ep("10.0.0.5", "web-1", "uid-1"), ep("10.7.0.1", "ghost", "g", notReady)}, true,
			[]string{"not-ready endpoint: pod ghost does not exist"}},
		{"the same on a stale node is the withdrawal's", []discoveryv1.Endpoint{ep("10.7.0.1", "ghost", "g", notReady)}, false, nil},
		{"an empty slice", nil, true, []string{ReasonEmpty}},
		{"an empty slice of a stale node", nil, false, nil},
		{"a pod that has ended", []discoveryv1.Endpoint{ep("10.0.0.9", "web-9", "uid-9")}, false, []string{"pod web-9 has ended (phase Failed)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := Input{Namespace: "ns", Node: "node-a", Selector: map[string]string{"app": "web"}, Pods: pods, Endpoints: tc.endpoints, WholeSlice: tc.whole}
			var got []string
			for _, f := range Decide(in) {
				got = append(got, f.Reason)
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestDecidePorts: a slice's port number must be what the resource's port resolves to on the
// Pod (a number is itself, a name the Pod's container port of that name and protocol).
func TestDecidePorts(t *testing.T) {
	web := pod("web-1", "uid-1", "node-a", "10.0.0.5", map[string]string{"app": "web"})
	web.Spec.Containers = []corev1.Container{{Name: "app", Ports: []corev1.ContainerPort{
		{Name: "http", ContainerPort: 8080}, {Name: "dns", ContainerPort: 5353, Protocol: corev1.ProtocolUDP},
	}}}
	pods := map[string]*corev1.Pod{"web-1": web}
	tests := []struct {
		name   string
		sp     *v1alpha1.ServicePort
		number int32
		want   string
	}{
		{"a number", &v1alpha1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}, 8080, ""},
		{"no target port is the port", &v1alpha1.ServicePort{Name: "http", Port: 8080}, 8080, ""},
		{"a name", &v1alpha1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}, 8080, ""},
		{"a name of another protocol", &v1alpha1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromString("dns")}, 5353, ""},
		{"another number", &v1alpha1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}, 22, "port 22 is not the target port of pod web-1 (8080)"},
		{"a name the pod does not have", &v1alpha1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromString("grpc")}, 8080, "pod web-1 has no container port grpc"},
		{"a name of the wrong protocol", &v1alpha1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromString("dns")}, 5353, "pod web-1 has no container port dns"},
		{"no port of the resource: not judged here", nil, 22, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := Input{Namespace: "ns", Node: "node-a", Selector: map[string]string{"app": "web"}, Pods: pods,
				Endpoints: []discoveryv1.Endpoint{ep("10.0.0.5", "web-1", "uid-1")}, ServicePort: tc.sp,
				Ports: []discoveryv1.EndpointPort{{Port: ptr.To(tc.number)}}}
			var got string
			if f := Decide(in); len(f) > 0 {
				got = f[0].Reason
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

// step is one audit given to a confirmer.
type step struct {
	slice  string
	uid    types.UID
	node   string
	forged []Forged
	clean  []string
	at     time.Duration
	gone   bool // the slice is deleted before this step (forgetSlice), nothing observed
}

func TestConfirmer(t *testing.T) {
	const w = time.Second
	t0 := time.Unix(1000, 0)
	a := Forged{Address: "10.0.0.1", Pod: "p", UID: "u", Reason: "r"}
	b := Forged{Address: "10.0.0.2", Pod: "p", UID: "u", Reason: "r"}
	aOtherPod := Forged{Address: "10.0.0.1", Pod: "q", UID: "v", Reason: "r"}
	tests := []struct {
		name      string
		steps     []step
		confirmed int
		repeated  int
		wait      time.Duration
	}{
		{"first sight waits a window", []step{{slice: "s", uid: "u1", forged: []Forged{a}}}, 0, 0, w},
		{"a mismatch that lasts a window is confirmed", []step{
			{slice: "s", uid: "u1", forged: []Forged{a}},
			{slice: "s", uid: "u1", forged: []Forged{a}, at: w},
		}, 1, 0, 0},
		{"the endpoint seen clean in between resets", []step{
			{slice: "s", uid: "u1", forged: []Forged{a}},
			{slice: "s", uid: "u1", clean: []string{fullKey("ns", a)}, at: w / 2},
			{slice: "s", uid: "u1", forged: []Forged{a}, at: w},
		}, 0, 0, w},
		{"a rewrite keeping the forged endpoint does not reset", []step{
			{slice: "s", uid: "u1", forged: []Forged{a}},
			{slice: "s", uid: "u1", forged: []Forged{a, b}, at: w / 2},
			{slice: "s", uid: "u1", forged: []Forged{a, b}, at: w},
		}, 1, 0, 0},
		{"a forger rotating addresses is caught by the slice's window", []step{
			{slice: "s", uid: "u1", forged: []Forged{a}},
			{slice: "s", uid: "u1", forged: []Forged{b}, at: w * 9 / 10},
			{slice: "s", uid: "u1", forged: []Forged{{Address: "10.0.0.3"}}, at: w * 18 / 10},
			{slice: "s", uid: "u1", forged: []Forged{{Address: "10.0.0.4"}}, at: w * 27 / 10},
			{slice: "s", uid: "u1", forged: []Forged{{Address: "10.0.0.5"}}, at: w * 3},
		}, 1, 0, 0},
		{"Rotation: deleted before the window and written under another name", []step{
			{slice: "s1", uid: "u1", forged: []Forged{a}},
			{slice: "s1", gone: true, at: w * 8 / 10},
			{slice: "s2", uid: "u2", forged: []Forged{a}, at: w},
		}, 1, 0, 0},
		{"Rotation: two names alternating", []step{
			{slice: "s1", uid: "u1", forged: []Forged{a}},
			{slice: "s1", gone: true, at: w * 4 / 10},
			{slice: "s2", uid: "u2", forged: []Forged{a}, at: w / 2},
			{slice: "s2", gone: true, at: w * 9 / 10},
			{slice: "s1", uid: "u3", forged: []Forged{a}, at: w},
		}, 1, 0, 0},
		{"a confirmed forgery repeated under another name is confirmed at once", []step{
			{slice: "s1", uid: "u1", forged: []Forged{a}},
			{slice: "s1", uid: "u1", forged: []Forged{a}, at: w},
			{slice: "s1", gone: true, at: w},
			{slice: "s2", uid: "u2", forged: []Forged{a}, at: 2 * w},
		}, 1, 1, 0},
		{"so is its address under another Pod", []step{
			{slice: "s1", uid: "u1", forged: []Forged{a}},
			{slice: "s1", uid: "u1", forged: []Forged{a}, at: w},
			{slice: "s2", uid: "u2", forged: []Forged{aOtherPod}, at: 2 * w},
		}, 1, 1, 0},
		{"but not for another node", []step{
			{slice: "s1", uid: "u1", forged: []Forged{a}},
			{slice: "s1", uid: "u1", forged: []Forged{a}, at: w},
			{slice: "s2", uid: "u2", node: "node-b", forged: []Forged{a}, at: 2 * w},
		}, 0, 0, w},
		{"a confirmed forgery is forgotten after KnownTTL", []step{
			{slice: "s1", uid: "u1", forged: []Forged{a}},
			{slice: "s1", uid: "u1", forged: []Forged{a}, at: w},
			{slice: "s2", uid: "u2", forged: []Forged{a}, at: w + KnownTTL + w},
		}, 0, 0, w},
		{"a pending one after PendingTTL", []step{
			{slice: "s1", uid: "u1", forged: []Forged{a}},
			{slice: "s1", gone: true, at: w / 2},
			{slice: "s2", uid: "u2", forged: []Forged{a}, at: PendingTTL + w},
		}, 0, 0, w},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newConfirmer(w)
			var v verdict
			for _, s := range tc.steps {
				name := types.NamespacedName{Namespace: "ns", Name: s.slice}
				if s.gone {
					c.forgetSlice(name)
					continue
				}
				node := s.node
				if node == "" {
					node = "node-a"
				}
				v = c.observe(name, s.uid, node, "ns", s.forged, s.clean, t0.Add(s.at))
			}
			assert.Len(t, v.confirmed, tc.confirmed)
			assert.Len(t, v.repeated, tc.repeated)
			assert.Equal(t, tc.wait, v.wait)
		})
	}
}

// TestConfirmerIPChangeRepublishedIsNotAForgery: an honest agent whose Pod changed IP writes
// the new one within the window; the old address, never seen again, is never confirmed and is
// forgotten (the positive control of rotation).
func TestConfirmerIPChangeRepublishedIsNotAForgery(t *testing.T) {
	const w = time.Second
	t0 := time.Unix(1000, 0)
	c := newConfirmer(w)
	name := types.NamespacedName{Namespace: "ns", Name: "web-http-node-a"}
	old := Forged{Address: "10.0.0.5", Pod: "web-1", UID: "u", Reason: "address 10.0.0.5 is not an IP of pod web-1"}
	v := c.observe(name, "s1", "node-a", "ns", []Forged{old}, nil, t0)
	assert.Empty(t, v.confirmed)
	renewed := fullKey("ns", Forged{Address: "10.0.0.50", Pod: "web-1", UID: "u"})
	for i := 1; i <= 20; i++ {
		v = c.observe(name, "s1", "node-a", "ns", nil, []string{renewed}, t0.Add(w/5+time.Duration(i)*w))
		assert.Empty(t, v.confirmed)
	}
	_, pendingN, known := c.remembered()
	assert.Equal(t, 1, pendingN, "the old address waits to expire")
	assert.Zero(t, known)
	c.observe(name, "s1", "node-a", "ns", nil, []string{renewed}, t0.Add(PendingTTL+2*w))
	nodes, pendingN, _ := c.remembered()
	assert.Zero(t, nodes+pendingN, "and is forgotten")
}

// TestConfirmerMemoryIsBounded: per node, pending and confirmed forgeries are capped (a node
// past MaxPendingPerNode floods: its further forgeries are confirmed at once), and so are the
// nodes.
func TestConfirmerMemoryIsBounded(t *testing.T) {
	const w = time.Second
	t0 := time.Unix(1000, 0)
	c := newConfirmer(w)
	counts := map[string]int{}
	c.onKnown = func(node string, n int) { counts[node] = n }
	name := types.NamespacedName{Namespace: "ns", Name: "s"}
	flood := manyForged(MaxPendingPerNode + 1)
	for i := range flood {
		flood[i].Address = fmt.Sprintf("10.%d.%d.%d", i/65536, i/256%256, i%256)
	}
	v := c.observe(name, "u1", "node-a", "ns", flood, nil, t0)
	assert.Len(t, v.confirmed, 1, "the one past the cap is confirmed at once")
	_, pendingN, _ := c.remembered()
	assert.Equal(t, MaxPendingPerNode, pendingN)
	v = c.observe(name, "u1", "node-a", "ns", flood, nil, t0.Add(w))
	assert.Len(t, v.confirmed, len(flood))
	_, pendingN, known := c.remembered()
	assert.Zero(t, pendingN)
	assert.Equal(t, MaxKnownPerNode, known, "confirmed forgeries are capped per node")
	assert.Equal(t, MaxKnownPerNode, counts["node-a"], "the metric follows")

	for i := range MaxNodes + 5 {
		c.observe(name, "u1", fmt.Sprintf("n-%d", i), "ns", []Forged{{Address: "10.9.9.9"}}, nil, t0.Add(2*w))
	}
	nodes, _, _ := c.remembered()
	assert.Equal(t, MaxNodes, nodes, "nodes are capped")
	c.observe(name, "u1", "n-x", "ns", nil, nil, t0.Add(2*w+KnownTTL+PendingTTL))
	nodes, _, _ = c.remembered()
	assert.Zero(t, nodes, "everything expires")
	assert.Zero(t, counts["node-a"], "and the metric's series goes")
}
