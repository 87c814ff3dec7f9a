// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/scheduler"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/sliceplan"
)

// The decide step is pure: these tests give it what observe would read and check what it
// decides, without a cluster.

const testNode = "node-a"

var (
	webPort  = v1alpha1.ServicePort{Name: "web", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("web")}
	smtpPort = v1alpha1.ServicePort{Name: "smtp", Port: 25, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(2525)}
	webProbe = v1alpha1.Probe{Mode: v1alpha1.ProbeModeHTTP, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 1,
		HTTP: &v1alpha1.HTTPProbe{TargetPort: intstr.FromString("web"), Path: "/"}}
	smtpProbe = v1alpha1.Probe{Mode: v1alpha1.ProbeModeTCP, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 1,
		TCP: &v1alpha1.TCPProbe{TargetPort: intstr.FromInt32(2525)}}
	pgProbe = v1alpha1.Probe{Mode: v1alpha1.ProbeModePostgreSQL, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 1,
		PostgreSQL: &v1alpha1.PostgreSQLProbe{TargetPort: intstr.FromInt32(5432), AuthSecretName: "db-creds"}}
)

func vm(probes ...v1alpha1.Probe) *v1alpha1.ServiceWithHealthchecks {
	swh := &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns", UID: "uid-vm"},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Ports:    []v1alpha1.ServicePort{webPort, smtpPort},
			Selector: map[string]string{"app": "vm"},
		},
	}
	if len(probes) > 0 {
		swh.Spec.Healthcheck = &v1alpha1.Healthcheck{PeriodSeconds: 10, Probes: probes}
	}
	// The controller has created the child Service (ServiceOwned).
	swh.Status.ClusterIP = "10.96.0.10"
	return swh
}

func foreignService(swh *v1alpha1.ServiceWithHealthchecks) *v1alpha1.ServiceWithHealthchecks {
	swh.Status.ClusterIP = ""
	return swh
}

type podMod func(*corev1.Pod)

func vmPod(name string, mods ...podMod) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name), Labels: map[string]string{"app": "vm"}},
		Spec: corev1.PodSpec{NodeName: testNode, Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{
			{Name: "web", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
			{Name: "smtp", ContainerPort: 2525, Protocol: corev1.ProtocolTCP},
		}}}},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: "10.0.0." + name[len(name)-1:], PodIPs: []corev1.PodIP{{IP: "10.0.0." + name[len(name)-1:]}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

func notReadyPod(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }
func pending(p *corev1.Pod)     { p.Status.Phase = corev1.PodPending }
func podIPsOnly(p *corev1.Pod)  { p.Status.PodIP = "" }
func dualStack(p *corev1.Pod) {
	p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: "fd00::" + p.Name[len(p.Name)-1:]})
}

// results gives the probe of the given index on every pod the state; targets are keyed as
// Decide keys them, so the test first asks Decide for the targets.
func results(swh *v1alpha1.ServiceWithHealthchecks, pods []*corev1.Pod, state map[string]map[int]portrule.State) scheduler.Results {
	d := Decide(Observed{Resource: swh, Node: testNode, Pods: pods})
	out := scheduler.Results{}
	for _, t := range d.Targets {
		if s, ok := state[t.PodName][t.Key.Probe]; ok {
			r := portrule.ProbeResult{State: s}
			if s == portrule.Fail {
				r.Reason = "connection refused"
			}
			out[t.Key.PodUID] = append(out[t.Key.PodUID], scheduler.Result{Key: t.Key, Result: r})
		}
	}
	return out
}

// published is what a decision would leave in a slice: "address=RST" (ready, serving,
// terminating as T/F) per desired slice name.
func published(ds []sliceplan.Desired) map[string][]string {
	out := map[string][]string{}
	for _, d := range ds {
		var eps []string
		for _, e := range d.Slice.Endpoints {
			c := e.Conditions
			eps = append(eps, e.Addresses[0]+"="+tf(*c.Ready)+tf(*c.Serving)+tf(*c.Terminating))
		}
		out[d.Slice.Name] = eps
	}
	return out
}

func tf(b bool) string {
	if b {
		return "T"
	}
	return "F"
}

// asExisting turns desired slices into what the API server would hold after they were written.
func asExisting(ds []sliceplan.Desired) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, d := range ds {
		s := d.Slice.DeepCopy()
		s.ResourceVersion = "1"
		out = append(out, s)
	}
	return out
}

// writtenWith gives the slices an earlier decision with the given results wrote.
func writtenWith(state map[string]map[int]portrule.State) func(*v1alpha1.ServiceWithHealthchecks, []*corev1.Pod) []*discoveryv1.EndpointSlice {
	return func(swh *v1alpha1.ServiceWithHealthchecks, pods []*corev1.Pod) []*discoveryv1.EndpointSlice {
		r := results(swh, pods, state)
		return asExisting(Decide(Observed{Resource: swh, Node: testNode, Pods: pods, Results: r}).Desired)
	}
}

func targetsOf(d Decision) []string {
	var out []string
	for _, t := range d.Targets {
		out = append(out, t.PodName+"/"+string(t.Probe.Mode)+"@"+t.PodIP+":"+itoa(t.Port))
	}
	sort.Strings(out)
	return out
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

func notes(d Decision) []string {
	var out []string
	for _, ts := range d.Transitions {
		for _, t := range ts {
			out = append(out, noteOf(t))
		}
	}
	sort.Strings(out)
	return out
}

func TestDecide(t *testing.T) {
	pass, fail := portrule.Pass, portrule.Fail
	cases := map[string]struct {
		swh      *v1alpha1.ServiceWithHealthchecks
		pods     []*corev1.Pod
		state    map[string]map[int]portrule.State
		existing func(swh *v1alpha1.ServiceWithHealthchecks, pods []*corev1.Pod) []*discoveryv1.EndpointSlice

		targets     []string
		slices      map[string][]string
		transitions []string
		secrets     []string
	}{
		"a resource without probes publishes every port from the pod's Ready condition and runs nothing": {
			swh:  vm(),
			pods: []*corev1.Pod{vmPod("vm-1"), vmPod("vm-2", notReadyPod)},
			slices: map[string][]string{
				"vm-web-node-a":  {"10.0.0.1=TTF", "10.0.0.2=FFF"},
				"vm-smtp-node-a": {"10.0.0.1=TTF", "10.0.0.2=FFF"},
			},
		},
		"one binding gives the targets and the verdicts: a failing port is withdrawn on that port only": {
			swh:     vm(webProbe, smtpProbe),
			pods:    []*corev1.Pod{vmPod("vm-1", notReadyPod)},
			state:   map[string]map[int]portrule.State{"vm-1": {0: pass, 1: fail}},
			targets: []string{"vm-1/HTTP@10.0.0.1:8080", "vm-1/TCP@10.0.0.1:2525"},
			slices: map[string][]string{
				"vm-web-node-a":  {"10.0.0.1=TTF"},
				"vm-smtp-node-a": {"10.0.0.1=FFF"},
			},
			transitions: []string{"pod vm-1, port smtp: probe 1 (TCP): connection refused"},
		},
		"an endpoint whose probes have not decided is left out until they do": {
			swh:     vm(webProbe),
			pods:    []*corev1.Pod{vmPod("vm-1")},
			targets: []string{"vm-1/HTTP@10.0.0.1:8080"},
			// smtp is checked by no probe (the web probe's port is web's alone): it follows the
			// pod's Ready condition.
			slices: map[string][]string{"vm-smtp-node-a": {"10.0.0.1=TTF"}},
		},
		"a pod that cannot be published is not probed either": {
			swh:  vm(webProbe),
			pods: []*corev1.Pod{vmPod("vm-1", pending)},
		},
		"a pod with only podIPs is probed and published on its first address": {
			swh:     vm(webProbe, smtpProbe),
			pods:    []*corev1.Pod{vmPod("vm-1", podIPsOnly)},
			state:   map[string]map[int]portrule.State{"vm-1": {0: pass, 1: pass}},
			targets: []string{"vm-1/HTTP@10.0.0.1:8080", "vm-1/TCP@10.0.0.1:2525"},
			slices:  map[string][]string{"vm-web-node-a": {"10.0.0.1=TTF"}, "vm-smtp-node-a": {"10.0.0.1=TTF"}},
		},
		"a verdict already in the slices is no transition": {
			swh:      vm(webProbe, smtpProbe),
			pods:     []*corev1.Pod{vmPod("vm-1")},
			state:    map[string]map[int]portrule.State{"vm-1": {0: pass, 1: fail}},
			existing: writtenWith(map[string]map[int]portrule.State{"vm-1": {0: pass, 1: fail}}),
			targets:  []string{"vm-1/HTTP@10.0.0.1:8080", "vm-1/TCP@10.0.0.1:2525"},
			slices:   map[string][]string{"vm-web-node-a": {"10.0.0.1=TTF"}, "vm-smtp-node-a": {"10.0.0.1=FFF"}},
		},
		"a port serving again is a transition, reported once for a dual-stack pod": {
			swh: func() *v1alpha1.ServiceWithHealthchecks {
				swh := vm(webProbe, smtpProbe)
				policy := corev1.IPFamilyPolicyRequireDualStack
				swh.Spec.IPFamilyPolicy = &policy
				return swh
			}(),
			pods:     []*corev1.Pod{vmPod("vm-1", dualStack)},
			state:    map[string]map[int]portrule.State{"vm-1": {0: pass, 1: pass}},
			existing: writtenWith(map[string]map[int]portrule.State{"vm-1": {0: pass, 1: fail}}),
			targets:  []string{"vm-1/HTTP@10.0.0.1:8080", "vm-1/TCP@10.0.0.1:2525"},
			slices: map[string][]string{
				"vm-web-node-a": {"10.0.0.1=TTF"}, "vm-web--node-a-ipv6": {"fd00::1=TTF"},
				"vm-smtp-node-a": {"10.0.0.1=TTF"}, "vm-smtp--node-a-ipv6": {"fd00::1=TTF"},
			},
			transitions: []string{"pod vm-1, port smtp: probes pass"},
		},
		"a dual-stack pod of a single-stack resource is published in the family of its ClusterIP only": {
			swh:     vm(webProbe, smtpProbe),
			pods:    []*corev1.Pod{vmPod("vm-1", dualStack)},
			state:   map[string]map[int]portrule.State{"vm-1": {0: pass, 1: pass}},
			targets: []string{"vm-1/HTTP@10.0.0.1:8080", "vm-1/TCP@10.0.0.1:2525"},
			slices:  map[string][]string{"vm-web-node-a": {"10.0.0.1=TTF"}, "vm-smtp-node-a": {"10.0.0.1=TTF"}},
		},
		"an undecided endpoint keeps what its slice says": {
			swh:      vm(webProbe, smtpProbe),
			pods:     []*corev1.Pod{vmPod("vm-1")},
			existing: writtenWith(map[string]map[int]portrule.State{"vm-1": {0: pass, 1: fail}}),
			targets:  []string{"vm-1/HTTP@10.0.0.1:8080", "vm-1/TCP@10.0.0.1:2525"},
			slices:   map[string][]string{"vm-web-node-a": {"10.0.0.1=TTF"}, "vm-smtp-node-a": {"10.0.0.1=FFF"}},
		},
		"credential Secrets are referenced while the resource has a pod on this node": {
			swh:     vm(pgProbe),
			pods:    []*corev1.Pod{vmPod("vm-1")},
			targets: []string{"vm-1/PostgreSQL@10.0.0.1:5432"},
			// The PostgreSQL probe checks no Service port: it is a whole-pod probe, undecided.
			secrets: []string{"ns/db-creds"},
		},
		"no pod on this node: no targets, no Secret watches, no slices": {
			swh: vm(pgProbe),
		},
		"a headless resource without ports publishes port-less slices, every probe checking the pod": {
			swh: func() *v1alpha1.ServiceWithHealthchecks {
				swh := vm(webProbe, smtpProbe)
				swh.Spec.Ports, swh.Spec.ClusterIP = nil, corev1.ClusterIPNone
				return swh
			}(),
			pods:        []*corev1.Pod{vmPod("vm-1"), vmPod("vm-2")},
			state:       map[string]map[int]portrule.State{"vm-1": {0: pass, 1: pass}, "vm-2": {0: pass, 1: fail}},
			targets:     []string{"vm-1/HTTP@10.0.0.1:8080", "vm-1/TCP@10.0.0.1:2525", "vm-2/HTTP@10.0.0.2:8080", "vm-2/TCP@10.0.0.2:2525"},
			slices:      map[string][]string{"vm-node-a": {"10.0.0.1=TTF", "10.0.0.2=FFF"}},
			transitions: []string{"pod vm-2: probe 1 (TCP): connection refused"},
		},
		"a resource whose Service is not its own publishes nothing but keeps probing": {
			swh:     foreignService(vm(webProbe, smtpProbe)),
			pods:    []*corev1.Pod{vmPod("vm-1")},
			state:   map[string]map[int]portrule.State{"vm-1": {0: pass, 1: pass}},
			targets: []string{"vm-1/HTTP@10.0.0.1:8080", "vm-1/TCP@10.0.0.1:2525"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o := Observed{Resource: tc.swh, Node: testNode, Zone: "zone-a", Pods: tc.pods}
			if tc.state != nil {
				o.Results = results(tc.swh, tc.pods, tc.state)
			}
			if tc.existing != nil {
				o.Slices = tc.existing(tc.swh, tc.pods)
			}
			d := Decide(o)
			assert.Equal(t, tc.targets, targetsOf(d), "targets")
			want := tc.slices
			if want == nil {
				want = map[string][]string{}
			}
			assert.Equal(t, want, published(d.Desired), "slices")
			assert.Equal(t, tc.transitions, notes(d), "transitions")
			var secrets []string
			for _, s := range d.SecretRefs {
				secrets = append(secrets, s.String())
			}
			assert.Equal(t, tc.secrets, secrets, "Secret references")
			for _, ds := range d.Desired {
				for _, e := range ds.Slice.Endpoints {
					require.NotNil(t, e.Zone)
					assert.Equal(t, "zone-a", *e.Zone, "the node's zone is on every endpoint")
				}
			}
		})
	}
}

func TestDecideIsStableInSteadyState(t *testing.T) {
	swh := vm(webProbe, smtpProbe)
	pods := []*corev1.Pod{vmPod("vm-1"), vmPod("vm-2")}
	r := results(swh, pods, map[string]map[int]portrule.State{"vm-1": {0: portrule.Pass, 1: portrule.Fail}, "vm-2": {0: portrule.Pass, 1: portrule.Pass}})
	first := Decide(Observed{Resource: swh, Node: testNode, Pods: pods, Results: r})
	require.Len(t, first.Plan.Create, 2, "the first decision creates both slices")
	again := Decide(Observed{Resource: swh, Node: testNode, Pods: pods, Results: r, Slices: asExisting(first.Desired)})
	assert.False(t, again.Plan.HasChanges(), "the same observation over what was written plans no write")
	assert.Empty(t, again.Transitions, "and reports nothing")
	assert.Equal(t, targetsOf(first), targetsOf(again), "the targets are the same, so the scheduler keeps their state")
	for i := range first.Targets {
		assert.Equal(t, first.Targets[i].Key, again.Targets[i].Key)
	}
}

func TestDecideTurnsAChangedProbeIntoANewTarget(t *testing.T) {
	pods := []*corev1.Pod{vmPod("vm-1")}
	before := Decide(Observed{Resource: vm(webProbe), Node: testNode, Pods: pods})
	changed := webProbe
	changed.HTTP = &v1alpha1.HTTPProbe{TargetPort: intstr.FromString("web"), Path: "/ready"}
	after := Decide(Observed{Resource: vm(changed), Node: testNode, Pods: pods})
	require.Len(t, before.Targets, 1)
	require.Len(t, after.Targets, 1)
	assert.NotEqual(t, before.Targets[0].Key, after.Targets[0].Key, "fresh thresholds for a changed probe")
}

func TestDecideRemovesWhatWasPublishedOnceTheServiceIsNotTheResources(t *testing.T) {
	swh := vm(webProbe, smtpProbe)
	pods := []*corev1.Pod{vmPod("vm-1")}
	r := results(swh, pods, map[string]map[int]portrule.State{"vm-1": {0: portrule.Pass, 1: portrule.Pass}})
	published := Decide(Observed{Resource: swh, Node: testNode, Pods: pods, Results: r})
	require.Len(t, published.Plan.Create, 2)
	foreign := Decide(Observed{Resource: foreignService(swh.DeepCopy()), Node: testNode, Pods: pods, Results: r, Slices: asExisting(published.Desired)})
	var deleted []string
	for _, s := range foreign.Plan.Delete {
		deleted = append(deleted, s.Name)
	}
	sort.Strings(deleted)
	assert.Equal(t, []string{"vm-smtp-node-a", "vm-web-node-a"}, deleted, "both slices go")
	assert.Empty(t, foreign.Plan.Create)
	assert.Empty(t, foreign.Plan.Update)
}

func TestDecideRefusesANameHeldByAnotherResource(t *testing.T) {
	// Resource "vm", port "web" on node "node-a" and resource "vm-web", port "node" on node "a"
	// both want "vm-web-node-a"; no other slice of the resource is held up by it.
	swh := vm()
	pods := []*corev1.Pod{vmPod("vm-1")}
	key := slicemeta.SliceKey{Resource: "vm-web", Port: "node", Node: "a"}
	held := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{
		Name: key.Name(), Namespace: "ns", Labels: key.Labels(), Annotations: key.Annotations(), ResourceVersion: "7",
		OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference("vm-web", "uid-other")},
	}, AddressType: discoveryv1.AddressTypeIPv4}
	d := Decide(Observed{Resource: swh, Node: testNode, Pods: pods, Slices: []*discoveryv1.EndpointSlice{held}})
	require.Len(t, d.Plan.Conflicts, 1)
	assert.Equal(t, "vm-web-node-a", d.Plan.Conflicts[0].Name)
	assert.True(t, strings.Contains(d.Plan.Conflicts[0].Holder, `resource "vm-web"`), d.Plan.Conflicts[0].Holder)
	require.Len(t, d.Plan.Create, 1)
	assert.Equal(t, "vm-smtp-node-a", d.Plan.Create[0].Name)
	assert.Empty(t, d.Plan.Delete, "another resource's slice is never deleted")
}

func TestEventNotesFitTheEventsAPI(t *testing.T) {
	cases := map[string]struct {
		reason string
		want   int
	}{
		"a short reason is kept whole":                 {reason: "connection refused", want: len("pod vm-1, port smtp: connection refused")},
		"a long reason is cut to the limit":            {reason: strings.Repeat("x", 5000), want: MaxNoteBytes},
		"a long reason of multi-byte runes stays text": {reason: strings.Repeat("€", 3000), want: MaxNoteBytes},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			n := noteOf(Transition{Pod: corev1.ObjectReference{Name: "vm-1"}, Port: "smtp", Reason: tc.reason})
			assert.LessOrEqual(t, len(n), MaxNoteBytes)
			assert.GreaterOrEqual(t, len(n), tc.want-3, "cut no more than a rune's worth below the limit")
			assert.True(t, utf8.ValidString(n), "the cut falls on a rune boundary")
			assert.True(t, strings.HasPrefix(n, "pod vm-1, port smtp: "))
		})
	}
}

func TestASummaryNoteCountsEveryTransitionAndFitsTheEventsAPI(t *testing.T) {
	var batch []Transition
	for i := range 40 {
		batch = append(batch, Transition{Pod: corev1.ObjectReference{Name: "web-" + strconv.Itoa(i)}, Port: "http",
			Serving: i%4 == 0, Reason: "probe 0 (HTTP): HTTP 503 " + strings.Repeat("x", 40)})
	}
	n := summaryNote(batch, 2*time.Second)
	assert.True(t, strings.HasPrefix(n, "40 port transitions within 2s: 30 stopped serving, 10 serve again. pod web-0, port http: probes pass;"), n)
	assert.LessOrEqual(t, len(n), MaxNoteBytes)
	assert.Regexp(t, `\(and \d+ more\)$`, n, "what does not fit is counted")
	short := summaryNote(batch[:2], 2*time.Second)
	assert.Equal(t, "2 port transitions within 2s: 1 stopped serving, 1 serve again. pod web-0, port http: probes pass; pod web-1, port http: probe 0 (HTTP): HTTP 503 "+strings.Repeat("x", 40), short)
}
