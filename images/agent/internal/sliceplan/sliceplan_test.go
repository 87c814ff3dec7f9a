// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package sliceplan

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
)

const node = "node-a"

func resource(ports ...v1alpha1.ServicePort) *v1alpha1.ServiceWithHealthchecks {
	return &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Name: "mail", Namespace: "ns", UID: "uid-1"},
		Spec:       v1alpha1.ServiceWithHealthchecksSpec{Ports: ports},
	}
}

var (
	webPort  = v1alpha1.ServicePort{Name: "web", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("web")}
	smtpPort = v1alpha1.ServicePort{Name: "smtp", Port: 25, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(2525)}
)

func pod(name string, webNumber int32, ips ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{
			{Name: "web", ContainerPort: webNumber, Protocol: corev1.ProtocolTCP},
		}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
	return p
}

// evaluated applies the per-port rule with every probe in the given state.
func evaluated(r *v1alpha1.ServiceWithHealthchecks, results portrule.Results, pods ...*corev1.Pod) []Pod {
	var out []Pod
	for _, p := range pods {
		out = append(out, Pod{Pod: p, Endpoints: portrule.Evaluate(&r.Spec, p, results)})
	}
	return out
}

// summary is a slice reduced to what the tests assert: port and "address=ready/serving/terminating".
type summary struct {
	port      int32
	endpoints []string
}

func summarize(t *testing.T, ds []Desired) map[string]summary {
	t.Helper()
	out := map[string]summary{}
	for _, d := range ds {
		s := d.Slice
		require.Len(t, s.Ports, 1)
		require.Equal(t, d.Key.Name(), s.Name)
		var eps []string
		for _, e := range s.Endpoints {
			c := e.Conditions
			require.NotNil(t, c.Ready, "ready is always explicit")
			require.NotNil(t, c.Serving, "serving is always explicit")
			require.NotNil(t, c.Terminating, "terminating is always explicit")
			eps = append(eps, e.Addresses[0]+"="+b(*c.Ready)+b(*c.Serving)+b(*c.Terminating))
		}
		out[s.Name] = summary{*s.Ports[0].Port, eps}
	}
	return out
}

func b(v bool) string {
	if v {
		return "T"
	}
	return "F"
}

func TestCompute(t *testing.T) {
	long := strings.Repeat("n", 250)
	fits := strings.Repeat("n", 240)
	tests := map[string]struct {
		res      *v1alpha1.ServiceWithHealthchecks
		node     string
		pods     []*corev1.Pod
		results  portrule.Results
		existing []*discoveryv1.EndpointSlice
		want     map[string]summary
	}{
		"one slice per port per node, with the resolved target port": {
			res:  resource(webPort, smtpPort),
			pods: []*corev1.Pod{pod("p1", 8080, "10.0.0.1"), pod("p2", 8080, "10.0.0.2")},
			want: map[string]summary{
				"mail-web-node-a":  {8080, []string{"10.0.0.1=TTF", "10.0.0.2=TTF"}},
				"mail-smtp-node-a": {2525, []string{"10.0.0.1=TTF", "10.0.0.2=TTF"}},
			},
		},
		"a single unnamed port is named after the resource and node only": {
			res:  resource(v1alpha1.ServicePort{Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}),
			pods: []*corev1.Pod{pod("p1", 8080, "10.0.0.1")},
			want: map[string]summary{"mail-node-a": {8080, []string{"10.0.0.1=TTF"}}},
		},
		"no pod on the node gives no slice at all": {
			res:  resource(webPort, smtpPort),
			want: map[string]summary{},
		},
		"a pod lacking the named port leaves that port's slice out": {
			res:  resource(webPort, smtpPort),
			pods: []*corev1.Pod{func() *corev1.Pod { p := pod("p1", 8080, "10.0.0.1"); p.Spec.Containers[0].Ports = nil; return p }()},
			want: map[string]summary{"mail-smtp-node-a": {2525, []string{"10.0.0.1=TTF"}}},
		},
		"a named port resolved to different numbers splits into suffixed slices": {
			res:  resource(webPort),
			pods: []*corev1.Pod{pod("p1", 8080, "10.0.0.1"), pod("p2", 8080, "10.0.0.2"), pod("p3", 9090, "10.0.0.3")},
			want: map[string]summary{
				"mail-web-node-a":      {8080, []string{"10.0.0.1=TTF", "10.0.0.2=TTF"}},
				"mail-web-node-a-9090": {9090, []string{"10.0.0.3=TTF"}},
			},
		},
		"a split port keeps the number it already published unsuffixed": {
			res:  resource(webPort),
			pods: []*corev1.Pod{pod("p1", 8080, "10.0.0.1"), pod("p2", 9090, "10.0.0.2"), pod("p3", 9090, "10.0.0.3")},
			existing: []*discoveryv1.EndpointSlice{existingSlice("mail-web-node-a", "web", 8080, discoveryv1.AddressTypeIPv4,
				discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}, Conditions: conds(true, true, false), TargetRef: &corev1.ObjectReference{UID: "uid-p1"}})},
			want: map[string]summary{
				"mail-web-node-a":      {8080, []string{"10.0.0.1=TTF"}},
				"mail-web-node-a-9090": {9090, []string{"10.0.0.2=TTF", "10.0.0.3=TTF"}},
			},
		},
		"a dual-stack pod is published in one slice per family": {
			res:  resource(smtpPort),
			pods: []*corev1.Pod{pod("p1", 8080, "10.0.0.1", "fd00::1")},
			want: map[string]summary{
				"mail-smtp-node-a":       {2525, []string{"10.0.0.1=TTF"}},
				"mail-smtp--node-a-ipv6": {2525, []string{"fd00::1=TTF"}},
			},
		},
		"a dual-stack resource publishes an IPv4-only pod in its IPv4 slice only": {
			res:  dualStack(resource(smtpPort)),
			pods: []*corev1.Pod{pod("p1", 8080, "10.0.0.1", "fd00::1"), pod("p2", 8080, "10.0.0.2")},
			want: map[string]summary{
				"mail-smtp-node-a":       {2525, []string{"10.0.0.1=TTF", "10.0.0.2=TTF"}},
				"mail-smtp--node-a-ipv6": {2525, []string{"fd00::1=TTF"}},
			},
		},
		"an IPv6-only pod is published in the IPv6 slice alone": {
			res:  dualStack(resource(smtpPort)),
			pods: []*corev1.Pod{pod("p1", 8080, "fd00::1")},
			want: map[string]summary{"mail-smtp--node-a-ipv6": {2525, []string{"fd00::1=TTF"}}},
		},
		"an IPv6 resource publishes dual-stack pods in IPv6 slices only": {
			res: func() *v1alpha1.ServiceWithHealthchecks {
				r := resource(smtpPort)
				r.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
				r.Status.ClusterIP = "fd00:96::1"
				return r
			}(),
			pods: []*corev1.Pod{pod("p1", 8080, "10.0.0.1", "fd00::1")},
			want: map[string]summary{"mail-smtp--node-a-ipv6": {2525, []string{"fd00::1=TTF"}}},
		},
		"a single-stack resource publishes in the family of its Service's ClusterIP": {
			res: func() *v1alpha1.ServiceWithHealthchecks {
				r := resource(smtpPort)
				r.Status.ClusterIP = "10.96.0.10"
				return r
			}(),
			pods: []*corev1.Pod{pod("p1", 8080, "10.0.0.1", "fd00::1")},
			want: map[string]summary{"mail-smtp-node-a": {2525, []string{"10.0.0.1=TTF"}}},
		},
		"an IPv6 split port keeps the number its slice had unsuffixed under the old IPv6 name": {
			res:  dualStack(resource(webPort)),
			pods: []*corev1.Pod{pod("p1", 8080, "fd00::1"), pod("p2", 9090, "fd00::2"), pod("p3", 9090, "fd00::3")},
			existing: []*discoveryv1.EndpointSlice{existingSlice("mail-web-node-a-ipv6", "web", 8080, discoveryv1.AddressTypeIPv6,
				discoveryv1.Endpoint{Addresses: []string{"fd00::1"}, Conditions: conds(true, true, false), TargetRef: &corev1.ObjectReference{UID: "uid-p1"}})},
			want: map[string]summary{
				"mail-web--node-a-ipv6":      {8080, []string{"fd00::1=TTF"}},
				"mail-web--node-a-9090-ipv6": {9090, []string{"fd00::2=TTF", "fd00::3=TTF"}},
			},
		},
		"an undecided endpoint keeps the verdict it has in an old-named IPv6 slice": {
			res:     dualStack(resourceWithProbe(smtpPort)),
			pods:    []*corev1.Pod{pod("p1", 8080, "fd00::1"), pod("p2", 8080, "fd00::2")},
			results: portrule.Results{},
			existing: []*discoveryv1.EndpointSlice{existingSlice("mail-smtp-node-a-ipv6", "smtp", 2525, discoveryv1.AddressTypeIPv6,
				discoveryv1.Endpoint{Addresses: []string{"fd00::1"}, Conditions: conds(true, true, false), TargetRef: &corev1.ObjectReference{UID: "uid-p1"}},
				discoveryv1.Endpoint{Addresses: []string{"fd00::2"}, Conditions: conds(false, false, false), TargetRef: &corev1.ObjectReference{UID: "uid-p2"}})},
			want: map[string]summary{"mail-smtp--node-a-ipv6": {2525, []string{"fd00::1=TTF", "fd00::2=FFF"}}},
		},
		"a long node name is replaced by its digest": {
			res:  resource(smtpPort),
			node: long,
			pods: []*corev1.Pod{pod("p1", 8080, "10.0.0.1")},
			want: map[string]summary{"mail-smtp-" + wellknown.NodeDigest(long): {2525, []string{"10.0.0.1=TTF"}}},
		},
		"a 240-character node name that fits stays in the name": {
			res:  resource(smtpPort),
			node: fits,
			pods: []*corev1.Pod{pod("p1", 8080, "10.0.0.1")},
			want: map[string]summary{"mail-smtp-" + fits: {2525, []string{"10.0.0.1=TTF"}}},
		},
		"an undecided endpoint keeps the verdict it has in an existing slice": {
			res:     resourceWithProbe(smtpPort),
			pods:    []*corev1.Pod{pod("p1", 8080, "10.0.0.1"), pod("p2", 8080, "10.0.0.2"), pod("p3", 8080, "10.0.0.3")},
			results: portrule.Results{},
			existing: []*discoveryv1.EndpointSlice{existingSlice("mail-smtp-node-a", "smtp", 2525, discoveryv1.AddressTypeIPv4,
				discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}, Conditions: conds(true, true, false), TargetRef: &corev1.ObjectReference{UID: "uid-p1"}},
				discoveryv1.Endpoint{Addresses: []string{"10.0.0.2"}, Conditions: conds(false, false, false), TargetRef: &corev1.ObjectReference{UID: "uid-p2"}})},
			// p3 was never published: it waits for its verdict outside the slice.
			want: map[string]summary{"mail-smtp-node-a": {2525, []string{"10.0.0.1=TTF", "10.0.0.2=FFF"}}},
		},
		"an undecided endpoint that was never published is left out": {
			res:     resourceWithProbe(smtpPort),
			pods:    []*corev1.Pod{pod("p1", 8080, "10.0.0.1")},
			results: portrule.Results{},
			want:    map[string]summary{},
		},
		"an endpoint never published is present once it is decided serving": {
			res:     resourceWithProbe(smtpPort),
			pods:    []*corev1.Pod{pod("p1", 8080, "10.0.0.1")},
			results: portrule.Results{0: {State: portrule.Pass}},
			want:    map[string]summary{"mail-smtp-node-a": {2525, []string{"10.0.0.1=TTF"}}},
		},
		"an endpoint never published is present once it is decided failing": {
			res:     resourceWithProbe(smtpPort),
			pods:    []*corev1.Pod{pod("p1", 8080, "10.0.0.1")},
			results: portrule.Results{0: {State: portrule.Fail, Reason: "refused"}},
			want:    map[string]summary{"mail-smtp-node-a": {2525, []string{"10.0.0.1=FFF"}}},
		},
		"an existing slice is not emptied by its undecided endpoints": {
			res:     resourceWithProbe(smtpPort),
			pods:    []*corev1.Pod{pod("p1", 8080, "10.0.0.1")},
			results: portrule.Results{},
			existing: []*discoveryv1.EndpointSlice{existingSlice("mail-smtp-node-a", "smtp", 2525, discoveryv1.AddressTypeIPv4,
				discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}, Conditions: conds(false, false, false), TargetRef: &corev1.ObjectReference{UID: "uid-p1"}})},
			want: map[string]summary{"mail-smtp-node-a": {2525, []string{"10.0.0.1=FFF"}}},
		},
		"an undecided endpoint never published is published ready when the resource publishes not-ready addresses": {
			res: func() *v1alpha1.ServiceWithHealthchecks {
				r := resourceWithProbe(smtpPort)
				r.Spec.PublishNotReadyAddresses = true
				return r
			}(),
			pods:    []*corev1.Pod{pod("p1", 8080, "10.0.0.1")},
			results: portrule.Results{},
			want:    map[string]summary{"mail-smtp-node-a": {2525, []string{"10.0.0.1=TFF"}}},
		},
		"a decided endpoint overrides an existing slice": {
			res:     resourceWithProbe(smtpPort),
			pods:    []*corev1.Pod{pod("p1", 8080, "10.0.0.1")},
			results: portrule.Results{0: {State: portrule.Fail, Reason: "refused"}},
			existing: []*discoveryv1.EndpointSlice{existingSlice("mail-smtp-node-a", "smtp", 2525, discoveryv1.AddressTypeIPv4,
				discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}, Conditions: conds(true, true, false), TargetRef: &corev1.ObjectReference{UID: "uid-p1"}})},
			want: map[string]summary{"mail-smtp-node-a": {2525, []string{"10.0.0.1=FFF"}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			n := tc.node
			if n == "" {
				n = node
			}
			got := Compute(Input{Resource: tc.res, Node: n, Zone: "zone-1", Pods: evaluated(tc.res, tc.results, tc.pods...), Existing: tc.existing})
			assert.Equal(t, tc.want, summarize(t, got))
			for _, d := range got {
				assert.LessOrEqual(t, len(d.Slice.Name), wellknown.MaxNameLength)
				assert.Empty(t, validation.IsDNS1123Subdomain(d.Slice.Name))
			}
		})
	}
}

// The primary (unsuffixed) number of a split port does not depend on which pods' probes decide
// first: the pods left out while undecided count too.
func TestComputeSplitPortCountsEndpointsWaitingForTheirVerdict(t *testing.T) {
	res := resourceWithProbe(webPort)
	waiting := evaluated(res, portrule.Results{}, pod("p1", 8080, "10.0.0.1"), pod("p2", 8080, "10.0.0.2"))
	decided := evaluated(res, portrule.Results{0: {State: portrule.Pass}}, pod("p3", 9090, "10.0.0.3"))
	got := Compute(Input{Resource: res, Node: node, Pods: append(waiting, decided...)})
	assert.Equal(t, map[string]summary{"mail-web-node-a-9090": {9090, []string{"10.0.0.3=TTF"}}}, summarize(t, got),
		"the decided pod alone is published, under the suffixed name: 8080 has more pods")

	all := evaluated(res, portrule.Results{0: {State: portrule.Pass}}, pod("p1", 8080, "10.0.0.1"), pod("p2", 8080, "10.0.0.2"), pod("p3", 9090, "10.0.0.3"))
	got = Compute(Input{Resource: res, Node: node, Pods: all, Existing: []*discoveryv1.EndpointSlice{got[0].Slice}})
	assert.Equal(t, map[string]summary{
		"mail-web-node-a":      {8080, []string{"10.0.0.1=TTF", "10.0.0.2=TTF"}},
		"mail-web-node-a-9090": {9090, []string{"10.0.0.3=TTF"}},
	}, summarize(t, got), "once decided, the others are published unsuffixed and nothing is renamed")
}

func TestComputeSliceContent(t *testing.T) {
	res := resource(webPort, smtpPort)
	appProto := "smtp"
	res.Spec.Ports[1].AppProtocol = &appProto
	p := pod("p1", 8080, "10.0.0.1")
	p.Spec.Hostname, p.Spec.Subdomain = "p1", "mail"
	got := Compute(Input{Resource: res, Node: node, Zone: "zone-1", Pods: evaluated(res, nil, p)})
	require.Len(t, got, 2)
	s := got[0].Slice
	assert.Equal(t, "mail-smtp-node-a", s.Name)
	assert.Equal(t, "ns", s.Namespace)
	assert.Equal(t, discoveryv1.AddressTypeIPv4, s.AddressType)
	assert.Equal(t, "smtp", *s.Ports[0].Name, "port name as in the Service")
	assert.Equal(t, corev1.ProtocolTCP, *s.Ports[0].Protocol)
	assert.Equal(t, &appProto, s.Ports[0].AppProtocol)
	assert.Equal(t, map[string]string{
		discoveryv1.LabelServiceName: "mail",
		discoveryv1.LabelManagedBy:   wellknown.ManagedBy,
		wellknown.LabelResource:      "mail",
		wellknown.LabelPort:          "smtp",
		wellknown.LabelNode:          node,
		wellknown.LabelNodeKey:       node,
	}, s.Labels)
	assert.Equal(t, node, s.Annotations[wellknown.AnnotationNode])
	assert.Equal(t, []metav1.OwnerReference{slicemeta.OwnerReference("mail", "uid-1")}, s.OwnerReferences)
	e := s.Endpoints[0]
	assert.Equal(t, node, *e.NodeName)
	assert.Equal(t, "zone-1", *e.Zone)
	assert.Equal(t, "p1", *e.Hostname)
	assert.Equal(t, &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "p1", UID: "uid-p1"}, e.TargetRef)

	noZone := Compute(Input{Resource: res, Node: node, Pods: evaluated(res, nil, p)})
	assert.Nil(t, noZone[0].Slice.Endpoints[0].Zone, "an unknown zone is omitted")
}

// dualStack makes r a RequireDualStack resource.
func dualStack(r *v1alpha1.ServiceWithHealthchecks) *v1alpha1.ServiceWithHealthchecks {
	policy := corev1.IPFamilyPolicyRequireDualStack
	r.Spec.IPFamilyPolicy = &policy
	r.Status.ClusterIP = "10.96.0.10"
	return r
}

func TestFamilies(t *testing.T) {
	policy := func(p corev1.IPFamilyPolicy) *corev1.IPFamilyPolicy { return &p }
	v4, v6 := discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	tests := map[string]struct {
		spec      v1alpha1.ServiceWithHealthchecksSpec
		clusterIP string
		want      []discoveryv1.AddressType
	}{
		"RequireDualStack publishes every family":                  {spec: v1alpha1.ServiceWithHealthchecksSpec{IPFamilyPolicy: policy(corev1.IPFamilyPolicyRequireDualStack)}, clusterIP: "10.96.0.1"},
		"PreferDualStack publishes every family the pods have":     {spec: v1alpha1.ServiceWithHealthchecksSpec{IPFamilyPolicy: policy(corev1.IPFamilyPolicyPreferDualStack)}, clusterIP: "10.96.0.1"},
		"PreferDualStack with one family listed is still dual":     {spec: v1alpha1.ServiceWithHealthchecksSpec{IPFamilyPolicy: policy(corev1.IPFamilyPolicyPreferDualStack), IPFamilies: []corev1.IPFamily{corev1.IPv6Protocol}}},
		"two families listed are both published":                   {spec: v1alpha1.ServiceWithHealthchecksSpec{IPFamilies: []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}}},
		"two cluster IPs asked for are both published":             {spec: v1alpha1.ServiceWithHealthchecksSpec{ClusterIPs: []string{"10.96.0.9", "fd00:96::9"}}},
		"one family listed is the only one":                        {spec: v1alpha1.ServiceWithHealthchecksSpec{IPFamilies: []corev1.IPFamily{corev1.IPv6Protocol}}, clusterIP: "fd00:96::1", want: []discoveryv1.AddressType{v6}},
		"SingleStack with one family listed is that one":           {spec: v1alpha1.ServiceWithHealthchecksSpec{IPFamilyPolicy: policy(corev1.IPFamilyPolicySingleStack), IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}}, want: []discoveryv1.AddressType{v4}},
		"an asked-for cluster IP names the family":                 {spec: v1alpha1.ServiceWithHealthchecksSpec{ClusterIP: "fd00:96::9"}, want: []discoveryv1.AddressType{v6}},
		"nothing said is the family of the Service's ClusterIP":    {clusterIP: "10.96.0.1", want: []discoveryv1.AddressType{v4}},
		"nothing said in an IPv6 cluster is IPv6":                  {clusterIP: "fd00:96::1", want: []discoveryv1.AddressType{v6}},
		"a headless resource that names no family publishes every": {spec: v1alpha1.ServiceWithHealthchecksSpec{ClusterIP: corev1.ClusterIPNone}, clusterIP: corev1.ClusterIPNone},
		"a headless resource with a family publishes that one":     {spec: v1alpha1.ServiceWithHealthchecksSpec{ClusterIP: corev1.ClusterIPNone, IPFamilies: []corev1.IPFamily{corev1.IPv6Protocol}}, clusterIP: corev1.ClusterIPNone, want: []discoveryv1.AddressType{v6}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := &v1alpha1.ServiceWithHealthchecks{Spec: tc.spec, Status: v1alpha1.ServiceWithHealthchecksStatus{ClusterIP: tc.clusterIP}}
			assert.Equal(t, tc.want, Families(r))
		})
	}
}

func resourceWithProbe(ports ...v1alpha1.ServicePort) *v1alpha1.ServiceWithHealthchecks {
	r := resource(ports...)
	r.Spec.Healthcheck = &v1alpha1.Healthcheck{PeriodSeconds: 1, Probes: []v1alpha1.Probe{{
		Mode: v1alpha1.ProbeModeTCP, SuccessThreshold: 1, FailureThreshold: 3,
		TCP: &v1alpha1.TCPProbe{TargetPort: intstr.FromInt32(2525)},
	}}}
	return r
}

func conds(ready, serving, terminating bool) discoveryv1.EndpointConditions {
	return discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}
}

func existingSlice(name, port string, number int32, family discoveryv1.AddressType, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	key := slicemeta.SliceKey{Resource: "mail", Port: port, Node: node}
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: key.Labels(), Annotations: key.Annotations(),
			OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference("mail", "uid-1")}},
		AddressType: family,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: &port, Port: &number}},
	}
}

// An agent upgraded from the old IPv6 name finds its old-named slice (same resource, port,
// node and family in the labels and annotation), creates the slice under the new name with the
// same endpoints and deletes the old one. The publisher creates before it deletes, so the
// endpoints are in some slice all along.
func TestDiffRenamesAnOldNamedIPv6Slice(t *testing.T) {
	res := dualStack(resourceWithProbe(smtpPort))
	old := existingSlice("mail-smtp-node-a-ipv6", "smtp", 2525, discoveryv1.AddressTypeIPv6,
		discoveryv1.Endpoint{Addresses: []string{"fd00::1"}, Conditions: conds(true, true, false), TargetRef: &corev1.ObjectReference{UID: "uid-p1"}})
	// The restarted agent's probes have not decided yet: the verdict comes from the old slice.
	desired := Compute(Input{Resource: res, Node: node, Pods: evaluated(res, portrule.Results{}, pod("p1", 8080, "fd00::1")),
		Existing: []*discoveryv1.EndpointSlice{old}})
	require.Len(t, desired, 1)
	plan := Diff("mail", "uid-1", node, desired, map[string]*discoveryv1.EndpointSlice{old.Name: old})
	require.Len(t, plan.Create, 1)
	assert.Equal(t, "mail-smtp--node-a-ipv6", plan.Create[0].Name)
	assert.Equal(t, old.Endpoints[0].Conditions, plan.Create[0].Endpoints[0].Conditions, "the new slice carries the old one's verdict")
	assert.Empty(t, plan.Update)
	require.Len(t, plan.Delete, 1)
	assert.Equal(t, "mail-smtp-node-a-ipv6", plan.Delete[0].Name)
	assert.Empty(t, plan.Conflicts)
}

func TestDiff(t *testing.T) {
	res := resource(webPort, smtpPort)
	desired := Compute(Input{Resource: res, Node: node, Pods: evaluated(res, nil, pod("p1", 8080, "10.0.0.1"))})
	require.Len(t, desired, 2)
	byName := func(ss ...*discoveryv1.EndpointSlice) map[string]*discoveryv1.EndpointSlice {
		m := map[string]*discoveryv1.EndpointSlice{}
		for _, s := range ss {
			m[s.Name] = s
		}
		return m
	}
	published := func(name string) *discoveryv1.EndpointSlice {
		for _, d := range desired {
			if d.Slice.Name == name {
				s := d.Slice.DeepCopy()
				s.ResourceVersion = "7"
				return s
			}
		}
		t.Fatalf("no desired slice %s", name)
		return nil
	}
	names := func(ss []*discoveryv1.EndpointSlice) []string {
		var out []string
		for _, s := range ss {
			out = append(out, s.Name)
		}
		return out
	}
	tests := map[string]struct {
		existing  map[string]*discoveryv1.EndpointSlice
		create    []string
		update    []string
		del       []string
		conflicts []string
	}{
		"nothing published yet creates every slice": {
			existing: byName(),
			create:   []string{"mail-smtp-node-a", "mail-web-node-a"},
		},
		"identical slices need no write": {
			existing: byName(published("mail-smtp-node-a"), published("mail-web-node-a")),
		},
		"a changed condition updates that slice only": {
			existing: byName(published("mail-smtp-node-a"), func() *discoveryv1.EndpointSlice {
				s := published("mail-web-node-a")
				s.Endpoints[0].Conditions = conds(false, false, false)
				return s
			}()),
			update: []string{"mail-web-node-a"},
		},
		"labels added by others are kept and need no write": {
			existing: byName(published("mail-web-node-a"), func() *discoveryv1.EndpointSlice {
				s := published("mail-smtp-node-a")
				s.Labels["team"] = "mail"
				return s
			}()),
		},
		"an own slice of a port that is no longer desired is deleted": {
			existing: byName(published("mail-smtp-node-a"), published("mail-web-node-a"),
				existingSlice("mail-imap-node-a", "imap", 143, discoveryv1.AddressTypeIPv4)),
			del: []string{"mail-imap-node-a"},
		},
		"another node's slice is never deleted": {
			existing: byName(published("mail-smtp-node-a"), published("mail-web-node-a"), func() *discoveryv1.EndpointSlice {
				s := existingSlice("mail-web-node-b", "web", 8080, discoveryv1.AddressTypeIPv4)
				s.Annotations[wellknown.AnnotationNode] = "node-b"
				return s
			}()),
		},
		"a name held by a slice of another module is a conflict and is not written": {
			existing: byName(published("mail-web-node-a"), func() *discoveryv1.EndpointSlice {
				s := published("mail-smtp-node-a")
				s.Labels[discoveryv1.LabelManagedBy] = "someone-else"
				return s
			}()),
			conflicts: []string{"mail-smtp-node-a"},
		},
		"a name held by another resource's slice is a conflict and is neither written nor deleted": {
			existing: byName(published("mail-web-node-a"), func() *discoveryv1.EndpointSlice {
				s := published("mail-smtp-node-a")
				s.Labels[wellknown.LabelResource] = "mail-smtp"
				s.Labels[wellknown.LabelPort] = "node"
				s.Annotations[wellknown.AnnotationNode] = "a"
				s.OwnerReferences = []metav1.OwnerReference{slicemeta.OwnerReference("mail-smtp", "uid-2")}
				return s
			}()),
			conflicts: []string{"mail-smtp-node-a"},
		},
		"a slice left by a deleted resource of the same name is taken over": {
			existing: byName(published("mail-web-node-a"), func() *discoveryv1.EndpointSlice {
				s := published("mail-smtp-node-a")
				s.OwnerReferences = []metav1.OwnerReference{slicemeta.OwnerReference("mail", "uid-old")}
				return s
			}()),
			update: []string{"mail-smtp-node-a"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := Diff("mail", "uid-1", node, desired, tc.existing)
			assert.Equal(t, tc.create, names(p.Create), "create")
			assert.Equal(t, tc.update, names(p.Update), "update")
			assert.Equal(t, tc.del, names(p.Delete), "delete")
			var conflicts []string
			for _, c := range p.Conflicts {
				conflicts = append(conflicts, c.Name)
				assert.NotEmpty(t, c.Holder)
			}
			assert.Equal(t, tc.conflicts, conflicts, "conflicts")
			assert.Equal(t, len(tc.create)+len(tc.update)+len(tc.del) > 0, p.HasChanges())
			for _, u := range p.Update {
				assert.Equal(t, "7", u.ResourceVersion, "an update carries the version it was computed from")
				assert.True(t, slicemeta.IsOwnedBy(u, "uid-1"))
			}
		})
	}
}

// A resource without ports (a headless one may have none) publishes port-less slices, as the
// built-in controller does for a headless Service without ports: one per node and family,
// named <resource>-<node>, listing addresses only.
func TestComputeWithoutPorts(t *testing.T) {
	res := resource()
	res.Spec.ClusterIP = "None"
	p1, p2 := pod("p1", 8080, "10.0.0.1", "fd00::1"), pod("p2", 8080, "10.0.0.2")
	p2.Status.Conditions[0].Status = corev1.ConditionFalse
	got := Compute(Input{Resource: res, Node: node, Pods: evaluated(res, nil, p1, p2)})
	names := map[string][]string{}
	for _, d := range got {
		assert.Empty(t, d.Slice.Ports, "%s lists no port", d.Slice.Name)
		port, ok := slicemeta.PortOf(d.Slice)
		assert.True(t, ok)
		assert.Empty(t, port, "the port label is empty, as for a single unnamed port")
		var eps []string
		for _, e := range d.Slice.Endpoints {
			eps = append(eps, e.Addresses[0]+"="+b(*e.Conditions.Ready)+b(*e.Conditions.Serving)+b(*e.Conditions.Terminating))
		}
		names[d.Slice.Name] = eps
	}
	assert.Equal(t, map[string][]string{
		"mail-node-a":       {"10.0.0.1=TTF", "10.0.0.2=FFF"},
		"mail--node-a-ipv6": {"fd00::1=TTF"},
	}, names, "without probes the pods follow their Ready condition")
}

// An appProtocol the EndpointSlice API refuses (admitted before admission checked it) is left
// out, so the port is still published.
func TestComputeLeavesOutAnAppProtocolTheAPIRefuses(t *testing.T) {
	res := resource(webPort)
	bad := "not a/qualified name"
	res.Spec.Ports[0].AppProtocol = &bad
	got := Compute(Input{Resource: res, Node: node, Pods: evaluated(res, nil, pod("p1", 8080, "10.0.0.1"))})
	require.Len(t, got, 1)
	assert.Nil(t, got[0].Slice.Ports[0].AppProtocol)
	good := "kubernetes.io/h2c"
	res.Spec.Ports[0].AppProtocol = &good
	got = Compute(Input{Resource: res, Node: node, Pods: evaluated(res, nil, pod("p1", 8080, "10.0.0.1"))})
	assert.Equal(t, &good, got[0].Slice.Ports[0].AppProtocol, "a qualified name is kept")
}
