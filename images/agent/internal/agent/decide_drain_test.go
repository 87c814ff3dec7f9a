// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
)

// drained annotates a pod with a drain value.
func drained(value string) podMod {
	return func(p *corev1.Pod) {
		p.Annotations = map[string]string{wellknown.AnnotationDrain: value}
	}
}

func terminatingPod(p *corev1.Pod) {
	now := metav1.NewTime(time.Unix(1, 0))
	p.DeletionTimestamp = &now
}

// before gives the slices an earlier decision wrote for the pods as they were then (with their
// own annotations) and the results of then.
func before(pods []*corev1.Pod, state map[string]map[int]portrule.State) func(*v1alpha1.ServiceWithHealthchecks, []*corev1.Pod) []*discoveryv1.EndpointSlice {
	return func(swh *v1alpha1.ServiceWithHealthchecks, _ []*corev1.Pod) []*discoveryv1.EndpointSlice {
		r := results(swh, pods, state)
		return asExisting(Decide(Observed{Resource: swh, Node: testNode, Zone: "zone-a", Pods: pods, Results: r}).Desired)
	}
}

// v020Drain turns the slices of existing into what v0.2.0 published for a drained pod: not
// ready, serving, not terminating (the triple Cilium 1.15 reads as an active backend).
func v020Drain(existing func(*v1alpha1.ServiceWithHealthchecks, []*corev1.Pod) []*discoveryv1.EndpointSlice) func(*v1alpha1.ServiceWithHealthchecks, []*corev1.Pod) []*discoveryv1.EndpointSlice {
	return func(swh *v1alpha1.ServiceWithHealthchecks, pods []*corev1.Pod) []*discoveryv1.EndpointSlice {
		out := existing(swh, pods)
		for _, s := range out {
			for i := range s.Endpoints {
				c := &s.Endpoints[i].Conditions
				if !*c.Ready && *c.Serving {
					c.Terminating = ptr.To(false)
				}
			}
		}
		return out
	}
}

func withPublishNotReady(swh *v1alpha1.ServiceWithHealthchecks) *v1alpha1.ServiceWithHealthchecks {
	swh.Spec.PublishNotReadyAddresses = true
	return swh
}

// Rule 8 in the decide step: the drain annotation takes a pod's ports out of new connections
// (ready=false, serving as probed, terminating when serving: the triple kube-proxy and Cilium
// read alike), and its changes are transitions.
func TestDecideDrain(t *testing.T) {
	pass, fail := portrule.Pass, portrule.Fail
	both := func(s portrule.State) map[string]map[int]portrule.State {
		return map[string]map[int]portrule.State{"vm-1": {0: s, 1: s}, "vm-2": {0: pass, 1: pass}}
	}
	const drainedNote = ": drained by annotation network.deckhouse.io/drain: existing connections continue, new ones go to other pods"
	const undrainedNote = ": the drain annotation no longer names it: published on its probe verdict again"
	cases := map[string]struct {
		swh      *v1alpha1.ServiceWithHealthchecks
		pods     []*corev1.Pod
		state    map[string]map[int]portrule.State
		existing func(*v1alpha1.ServiceWithHealthchecks, []*corev1.Pod) []*discoveryv1.EndpointSlice

		slices      map[string][]string
		transitions []string
		// silentWrite: the slices change without a reported transition (an undecided verdict).
		silentWrite bool
	}{
		"a pod drained from every resource is not ready but serving, and that is a drain of each port": {
			swh:      vm(webProbe, smtpProbe),
			pods:     []*corev1.Pod{vmPod("vm-1", drained("*")), vmPod("vm-2")},
			state:    both(pass),
			existing: before([]*corev1.Pod{vmPod("vm-1"), vmPod("vm-2")}, both(pass)),
			slices: map[string][]string{
				"vm-web-node-a":  {"10.0.0.1=FTT", "10.0.0.2=TTF"},
				"vm-smtp-node-a": {"10.0.0.1=FTT", "10.0.0.2=TTF"},
			},
			transitions: []string{"pod vm-1, port smtp" + drainedNote, "pod vm-1, port web" + drainedNote},
		},
		"removing the annotation publishes the pod on its verdicts again, and that is an undrain": {
			swh:      vm(webProbe, smtpProbe),
			pods:     []*corev1.Pod{vmPod("vm-1"), vmPod("vm-2")},
			state:    both(pass),
			existing: before([]*corev1.Pod{vmPod("vm-1", drained("*")), vmPod("vm-2")}, both(pass)),
			slices: map[string][]string{
				"vm-web-node-a":  {"10.0.0.1=TTF", "10.0.0.2=TTF"},
				"vm-smtp-node-a": {"10.0.0.1=TTF", "10.0.0.2=TTF"},
			},
			transitions: []string{"pod vm-1, port smtp" + undrainedNote, "pod vm-1, port web" + undrainedNote},
		},
		"a drain of one port by name leaves the other ports alone": {
			swh:      vm(webProbe, smtpProbe),
			pods:     []*corev1.Pod{vmPod("vm-1", drained(" vm/smtp ")), vmPod("vm-2")},
			state:    both(pass),
			existing: before([]*corev1.Pod{vmPod("vm-1"), vmPod("vm-2")}, both(pass)),
			slices: map[string][]string{
				"vm-web-node-a":  {"10.0.0.1=TTF", "10.0.0.2=TTF"},
				"vm-smtp-node-a": {"10.0.0.1=FTT", "10.0.0.2=TTF"},
			},
			transitions: []string{"pod vm-1, port smtp" + drainedNote},
		},
		"entries naming other resources are not this resource's: nothing changes": {
			swh:      vm(webProbe, smtpProbe),
			pods:     []*corev1.Pod{vmPod("vm-1", drained("mail,mail/web,vmx")), vmPod("vm-2")},
			state:    both(pass),
			existing: before([]*corev1.Pod{vmPod("vm-1"), vmPod("vm-2")}, both(pass)),
			slices: map[string][]string{
				"vm-web-node-a":  {"10.0.0.1=TTF", "10.0.0.2=TTF"},
				"vm-smtp-node-a": {"10.0.0.1=TTF", "10.0.0.2=TTF"},
			},
		},
		"an invalid entry does not undo the valid ones": {
			swh:      vm(webProbe, smtpProbe),
			pods:     []*corev1.Pod{vmPod("vm-1", drained("vm/web,Not_A_Name,,vm/")), vmPod("vm-2")},
			state:    both(pass),
			existing: before([]*corev1.Pod{vmPod("vm-1"), vmPod("vm-2")}, both(pass)),
			slices: map[string][]string{
				"vm-web-node-a":  {"10.0.0.1=FTT", "10.0.0.2=TTF"},
				"vm-smtp-node-a": {"10.0.0.1=TTF", "10.0.0.2=TTF"},
			},
			transitions: []string{"pod vm-1, port web" + drainedNote},
		},
		"a drain published by v0.2.0 (not terminating) is rewritten terminating, without a transition": {
			silentWrite: true,
			swh:         vm(webProbe, smtpProbe),
			pods:        []*corev1.Pod{vmPod("vm-1", drained("vm")), vmPod("vm-2")},
			state:       both(pass),
			existing:    v020Drain(before([]*corev1.Pod{vmPod("vm-1", drained("vm")), vmPod("vm-2")}, both(pass))),
			slices: map[string][]string{
				"vm-web-node-a":  {"10.0.0.1=FTT", "10.0.0.2=TTF"},
				"vm-smtp-node-a": {"10.0.0.1=FTT", "10.0.0.2=TTF"},
			},
		},
		"undraining a pod drained by v0.2.0 is an undrain": {
			swh:      vm(webProbe, smtpProbe),
			pods:     []*corev1.Pod{vmPod("vm-1"), vmPod("vm-2")},
			state:    both(pass),
			existing: v020Drain(before([]*corev1.Pod{vmPod("vm-1", drained("vm")), vmPod("vm-2")}, both(pass))),
			slices: map[string][]string{
				"vm-web-node-a":  {"10.0.0.1=TTF", "10.0.0.2=TTF"},
				"vm-smtp-node-a": {"10.0.0.1=TTF", "10.0.0.2=TTF"},
			},
			transitions: []string{"pod vm-1, port smtp" + undrainedNote, "pod vm-1, port web" + undrainedNote},
		},
		"a pod drained already is no transition and no write": {
			swh:      vm(webProbe, smtpProbe),
			pods:     []*corev1.Pod{vmPod("vm-1", drained("vm")), vmPod("vm-2")},
			state:    both(pass),
			existing: before([]*corev1.Pod{vmPod("vm-1", drained("vm")), vmPod("vm-2")}, both(pass)),
			slices: map[string][]string{
				"vm-web-node-a":  {"10.0.0.1=FTT", "10.0.0.2=TTF"},
				"vm-smtp-node-a": {"10.0.0.1=FTT", "10.0.0.2=TTF"},
			},
		},
		"a failing pod that is drained publishes nothing new: no drain to report": {
			swh:      vm(webProbe, smtpProbe),
			pods:     []*corev1.Pod{vmPod("vm-1", drained("*")), vmPod("vm-2")},
			state:    both(fail),
			existing: before([]*corev1.Pod{vmPod("vm-1"), vmPod("vm-2")}, both(fail)),
			slices: map[string][]string{
				"vm-web-node-a":  {"10.0.0.1=FFF", "10.0.0.2=TTF"},
				"vm-smtp-node-a": {"10.0.0.1=FFF", "10.0.0.2=TTF"},
			},
		},
		"a drained pod whose probes pass again stays out, and its Event says so": {
			swh:      vm(webProbe, smtpProbe),
			pods:     []*corev1.Pod{vmPod("vm-1", drained("vm/web")), vmPod("vm-2")},
			state:    both(pass),
			existing: before([]*corev1.Pod{vmPod("vm-1", drained("vm/web")), vmPod("vm-2")}, map[string]map[int]portrule.State{"vm-1": {0: fail, 1: pass}, "vm-2": {0: pass, 1: pass}}),
			slices: map[string][]string{
				"vm-web-node-a":  {"10.0.0.1=FTT", "10.0.0.2=TTF"},
				"vm-smtp-node-a": {"10.0.0.1=TTF", "10.0.0.2=TTF"},
			},
			transitions: []string{"pod vm-1, port web: probes pass; drained by annotation network.deckhouse.io/drain: no new connections until the annotation is removed"},
		},
		"the drain wins over publishNotReadyAddresses, also for a failing pod": {
			swh:      withPublishNotReady(vm(webProbe, smtpProbe)),
			pods:     []*corev1.Pod{vmPod("vm-1", drained("vm/web")), vmPod("vm-2")},
			state:    map[string]map[int]portrule.State{"vm-1": {0: fail, 1: fail}, "vm-2": {0: pass, 1: pass}},
			existing: before([]*corev1.Pod{vmPod("vm-1"), vmPod("vm-2")}, map[string]map[int]portrule.State{"vm-1": {0: fail, 1: fail}, "vm-2": {0: pass, 1: pass}}),
			slices: map[string][]string{
				"vm-web-node-a":  {"10.0.0.1=FFF", "10.0.0.2=TTF"},
				"vm-smtp-node-a": {"10.0.0.1=TFF", "10.0.0.2=TTF"},
			},
			transitions: []string{"pod vm-1, port web" + drainedNote},
		},
		"undraining a failing pod of a resource publishing not-ready addresses is an undrain": {
			swh:      withPublishNotReady(vm(webProbe, smtpProbe)),
			pods:     []*corev1.Pod{vmPod("vm-1"), vmPod("vm-2")},
			state:    map[string]map[int]portrule.State{"vm-1": {0: fail, 1: fail}, "vm-2": {0: pass, 1: pass}},
			existing: before([]*corev1.Pod{vmPod("vm-1", drained("vm/web")), vmPod("vm-2")}, map[string]map[int]portrule.State{"vm-1": {0: fail, 1: fail}, "vm-2": {0: pass, 1: pass}}),
			slices: map[string][]string{
				"vm-web-node-a":  {"10.0.0.1=TFF", "10.0.0.2=TTF"},
				"vm-smtp-node-a": {"10.0.0.1=TFF", "10.0.0.2=TTF"},
			},
			transitions: []string{"pod vm-1, port web" + undrainedNote},
		},
		"a terminating pod is out anyway: drained, it stays serving and terminating without a drain": {
			swh:      vm(webProbe, smtpProbe),
			pods:     []*corev1.Pod{vmPod("vm-1", drained("*"), terminatingPod), vmPod("vm-2")},
			state:    both(pass),
			existing: before([]*corev1.Pod{vmPod("vm-1", terminatingPod), vmPod("vm-2")}, both(pass)),
			slices: map[string][]string{
				"vm-web-node-a":  {"10.0.0.1=FTT", "10.0.0.2=TTF"},
				"vm-smtp-node-a": {"10.0.0.1=FTT", "10.0.0.2=TTF"},
			},
		},
		"an undecided drained endpoint keeps its carried verdict but is not ready, unreported": {
			silentWrite: true,
			swh:         vm(webProbe, smtpProbe),
			pods:        []*corev1.Pod{vmPod("vm-1", drained("*")), vmPod("vm-2")},
			state:       map[string]map[int]portrule.State{"vm-2": {0: pass, 1: pass}},
			existing:    before([]*corev1.Pod{vmPod("vm-1"), vmPod("vm-2")}, both(pass)),
			slices: map[string][]string{
				"vm-web-node-a":  {"10.0.0.1=FTT", "10.0.0.2=TTF"},
				"vm-smtp-node-a": {"10.0.0.1=FTT", "10.0.0.2=TTF"},
			},
		},
		"an unprobed port following the pod's Ready condition is drained too": {
			swh:      vm(),
			pods:     []*corev1.Pod{vmPod("vm-1", drained("vm/smtp")), vmPod("vm-2")},
			existing: before([]*corev1.Pod{vmPod("vm-1"), vmPod("vm-2")}, nil),
			slices: map[string][]string{
				"vm-web-node-a":  {"10.0.0.1=TTF", "10.0.0.2=TTF"},
				"vm-smtp-node-a": {"10.0.0.1=FTT", "10.0.0.2=TTF"},
			},
			transitions: []string{"pod vm-1, port smtp" + drainedNote},
		},
		"a resource without ports is drained by its name, not by a port": {
			swh: func() *v1alpha1.ServiceWithHealthchecks {
				swh := vm(webProbe)
				swh.Spec.Ports, swh.Spec.ClusterIP = nil, corev1.ClusterIPNone
				return swh
			}(),
			pods:        []*corev1.Pod{vmPod("vm-1", drained("vm")), vmPod("vm-2", drained("vm/web"))},
			state:       both(pass),
			existing:    before([]*corev1.Pod{vmPod("vm-1"), vmPod("vm-2")}, both(pass)),
			slices:      map[string][]string{"vm-node-a": {"10.0.0.1=FTT", "10.0.0.2=TTF"}},
			transitions: []string{"pod vm-1" + drainedNote},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o := Observed{Resource: tc.swh, Node: testNode, Zone: "zone-a", Pods: tc.pods, Slices: tc.existing(tc.swh, tc.pods)}
			if tc.state != nil {
				o.Results = results(tc.swh, tc.pods, tc.state)
			}
			d := Decide(o)
			assert.Equal(t, tc.slices, published(d.Desired), "slices")
			assert.Equal(t, tc.transitions, notes(d), "transitions")
			if tc.transitions == nil && !tc.silentWrite {
				assert.Empty(t, d.Plan.Create, "no transition, no write")
				assert.Empty(t, d.Plan.Update, "no transition, no write")
			}
		})
	}
}

// The drain transition of a port, from what the slices carried and the decided verdict.
func TestDrainChanged(t *testing.T) {
	ready, notReady, servingOnly := carried|carriedReady|carriedServing, carried, carried|carriedServing
	cases := map[string]struct {
		before uint8
		v      verdict
		pnr    bool
		want   DrainChange
	}{
		"a ready port drained":                               {ready, verdict{drained: true, serving: true}, false, DrainStarted},
		"a new pod that appears drained":                     {0, verdict{drained: true, serving: true}, false, DrainStarted},
		"a drained port still drained":                       {servingOnly, verdict{drained: true, serving: true}, false, DrainNone},
		"a failing port drained: nothing changes":            {notReady, verdict{drained: true}, false, DrainNone},
		"a ready port drained while it starts to fail":       {ready, verdict{drained: true}, false, DrainNone},
		"a drained port undrained":                           {servingOnly, verdict{ready: true, serving: true}, false, DrainEnded},
		"a failing port undrained: nothing changes":          {notReady, verdict{}, false, DrainNone},
		"a terminating port drained":                         {carried | carriedServing, verdict{drained: true, serving: true, terminating: true}, false, DrainNone},
		"publishNotReadyAddresses: a failing port drained":   {carried | carriedReady, verdict{drained: true}, true, DrainStarted},
		"publishNotReadyAddresses: a failing port undrained": {notReady, verdict{ready: true}, true, DrainEnded},
		"a ready port undrained: it was never drained":       {ready, verdict{ready: true, serving: true}, false, DrainNone},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, drainChanged(tc.before, tc.v, tc.pnr))
		})
	}
}

func TestPodDrainNote(t *testing.T) {
	assert.Equal(t, "ServiceWithHealthchecks web, ports http, metrics: drained by annotation network.deckhouse.io/drain: existing connections continue, new ones go to other pods",
		podDrainNote("web", []string{"http", "metrics"}, DrainStarted))
	assert.Equal(t, "ServiceWithHealthchecks web, port http: the drain annotation no longer names it: published on its probe verdict again",
		podDrainNote("web", []string{"http"}, DrainEnded))
	assert.Equal(t, "ServiceWithHealthchecks db: the drain annotation no longer names it: published on its probe verdict again",
		podDrainNote("db", nil, DrainEnded))
	n := drainProblemNote("web/", []string{`"web/": no port after the slash (write "web" for every port)`})
	assert.Contains(t, n, `annotation network.deckhouse.io/drain="web/" is not applied in part or at all: "web/": no port after the slash`)
}
