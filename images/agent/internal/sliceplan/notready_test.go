// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package sliceplan

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/deckhouse/service-with-healthchecks/api/notready"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
)

// verdictPod is a pod with explicit verdicts on web (index 0) and smtp (index 1).
func verdictPod(name, ip string, web, smtp portrule.Endpoint) Pod {
	web.PortIndex, web.Published, web.TargetPort = 0, true, 8080
	smtp.PortIndex, smtp.Published, smtp.TargetPort = 1, true, 2525
	return Pod{Pod: pod(name, 8080, ip), Endpoints: []portrule.Endpoint{web, smtp}}
}

var (
	passing = portrule.Endpoint{Decided: true, Ready: true, Serving: true}
	failing = func(reason string) portrule.Endpoint {
		return portrule.Endpoint{Decided: true, Reason: reason}
	}
)

// notes are the decoded notes of the desired slices by name (absent: no note).
func notes(t *testing.T, ds []Desired) map[string]notready.Note {
	t.Helper()
	out := map[string]notready.Note{}
	for _, d := range ds {
		v, ok := d.Slice.Annotations[notready.Annotation]
		if !ok {
			continue
		}
		n, err := notready.Parse(v)
		require.NoError(t, err)
		out[d.Slice.Name] = n
	}
	return out
}

func TestComputeNotesWhyPodsAreOutOfTheirPortOnly(t *testing.T) {
	res := resource(webPort, smtpPort)
	drained := passing
	drained.Drained = true
	drainedFailing := failing("probe 1 (TCP): connection refused")
	drainedFailing.Drained = true
	terminating := portrule.Endpoint{Decided: true, Serving: true, Terminating: true}
	ds := Compute(Input{Resource: res, Node: node, Pods: []Pod{
		verdictPod("p1", "10.0.0.1", failing("probe 0 (HTTP): HTTP status 503"), passing),
		verdictPod("p2", "10.0.0.2", passing, passing),
		verdictPod("p3", "10.0.0.3", passing, drained),
		verdictPod("p4", "10.0.0.4", passing, drainedFailing),
		verdictPod("p5", "10.0.0.5", terminating, passing),
	}})
	assert.Equal(t, map[string]notready.Note{
		"mail-web-node-a": {"p1": "probe 0 (HTTP): HTTP status 503", "p5": "pod is terminating"},
		"mail-smtp-node-a": {
			"p3": portrule.ReasonDrained,
			"p4": "probe 1 (TCP): connection refused; " + portrule.ReasonDrained,
		},
	}, notes(t, ds))

	all := Compute(Input{Resource: res, Node: node, Pods: []Pod{verdictPod("p2", "10.0.0.2", passing, passing)}})
	assert.Empty(t, notes(t, all), "a slice without a pod out has no note")
}

func TestComputeNoteIsBounded(t *testing.T) {
	res := resource(webPort, smtpPort)
	var pods []Pod
	for i := range 25 {
		pods = append(pods, verdictPod(fmt.Sprintf("p%02d", i), fmt.Sprintf("10.0.0.%d", i+1),
			failing("probe 0 (HTTP): "+strings.Repeat("\x00é\"<", 400)), passing))
	}
	ds := Compute(Input{Resource: res, Node: node, Pods: pods})
	var web *discoveryv1.EndpointSlice
	for _, d := range ds {
		if d.Key.Port == "web" {
			web = d.Slice
		}
	}
	require.NotNil(t, web)
	require.Len(t, web.Endpoints, 25)
	v := web.Annotations[notready.Annotation]
	assert.LessOrEqual(t, len(v), notready.MaxAnnotationBytes)
	n, err := notready.Parse(v)
	require.NoError(t, err)
	require.Len(t, n, notready.MaxPods, "the first MaxPods pods by name")
	for i := range notready.MaxPods {
		why, ok := n[fmt.Sprintf("p%02d", i)]
		require.True(t, ok, "pod p%02d is among the first by name", i)
		assert.LessOrEqual(t, len(why), notready.MaxReasonBytes)
		assert.NotContains(t, why, "\x00")
		assert.True(t, strings.HasSuffix(why, "…"))
	}
}

// A pod whose verdict is undecided (a restarted agent) and that the slices carry out keeps the
// reason their note gives.
func TestComputeCarriesTheReasonOfAnUndecidedPodOut(t *testing.T) {
	res := resource(webPort, smtpPort)
	before := Compute(Input{Resource: res, Node: node, Pods: []Pod{
		verdictPod("p1", "10.0.0.1", failing("probe 0 (HTTP): HTTP status 503"), passing),
		verdictPod("p2", "10.0.0.2", passing, passing),
	}})
	var existing []*discoveryv1.EndpointSlice
	for _, d := range before {
		existing = append(existing, d.Slice)
	}
	undecided := portrule.Endpoint{Reason: "waiting for a decisive probe result"}
	after := Compute(Input{Resource: res, Node: node, Existing: existing, Pods: []Pod{
		verdictPod("p1", "10.0.0.1", undecided, undecided),
		verdictPod("p2", "10.0.0.2", undecided, undecided),
	}})
	assert.Equal(t, map[string]notready.Note{"mail-web-node-a": {"p1": "probe 0 (HTTP): HTTP status 503"}}, notes(t, after))
}

// The note is written with a verdict change only: a reason whose text changes while the
// verdicts stay writes nothing; a pod that goes out writes its slice with the note; one that
// comes back removes it.
func TestDiffWritesTheNoteOnlyWithAVerdictChange(t *testing.T) {
	res := resource(webPort, smtpPort)
	compute := func(web portrule.Endpoint) map[string]*discoveryv1.EndpointSlice {
		out := map[string]*discoveryv1.EndpointSlice{}
		for _, d := range Compute(Input{Resource: res, Node: node, Pods: []Pod{
			verdictPod("p1", "10.0.0.1", web, passing), verdictPod("p2", "10.0.0.2", passing, passing),
		}}) {
			s := d.Slice.DeepCopy()
			s.ResourceVersion = "7"
			if s.Annotations == nil {
				s.Annotations = map[string]string{}
			}
			s.Annotations["someone.else/keeps"] = "this"
			out[s.Name] = s
		}
		return out
	}
	plan := func(existing map[string]*discoveryv1.EndpointSlice, web portrule.Endpoint) Plan {
		return Diff(res.Name, res.UID, node, Compute(Input{Resource: res, Node: node, Pods: []Pod{
			verdictPod("p1", "10.0.0.1", web, passing), verdictPod("p2", "10.0.0.2", passing, passing),
		}}), existing)
	}

	out := compute(failing("probe 0 (HTTP): timed out"))
	require.Contains(t, out["mail-web-node-a"].Annotations[notready.Annotation], "timed out")
	assert.False(t, plan(out, failing("probe 0 (HTTP): connection refused")).HasChanges(),
		"a new reason without a verdict change writes nothing")

	in := compute(passing)
	p := plan(in, failing("probe 0 (HTTP): connection refused"))
	require.Len(t, p.Update, 1, "the pod going out writes its port's slice")
	assert.Equal(t, `{"p1":"probe 0 (HTTP): connection refused"}`, p.Update[0].Annotations[notready.Annotation])
	assert.Equal(t, "this", p.Update[0].Annotations["someone.else/keeps"])

	p = plan(out, passing)
	require.Len(t, p.Update, 1, "the pod coming back writes its port's slice")
	assert.NotContains(t, p.Update[0].Annotations, notready.Annotation, "and removes the note")
	assert.Equal(t, "this", p.Update[0].Annotations["someone.else/keeps"])
}
