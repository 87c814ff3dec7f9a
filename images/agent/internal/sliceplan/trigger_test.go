// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package sliceplan

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
)

// smtpEndpoint is a pod's one endpoint on smtpPort with the given verdict, decided at changed.
func smtpEndpoint(serving bool, changed time.Time) []portrule.Endpoint {
	ready, serving, terminating := portrule.Conditions(serving, false, false)
	return []portrule.Endpoint{{PortIndex: 0, Published: true, TargetPort: 2525, Ready: ready, Serving: serving,
		Terminating: terminating, Decided: true, Changed: changed, Probes: []int{0}}}
}

// plan computes, diffs and stamps the slices of the pods against existing (one slice at most)
// and returns the one slice written, or nil.
func plan(t *testing.T, pods []Pod, existing *discoveryv1.EndpointSlice, now time.Time) *discoveryv1.EndpointSlice {
	t.Helper()
	r := resource(smtpPort)
	in := Input{Resource: r, Node: node, Pods: pods}
	byName := map[string]*discoveryv1.EndpointSlice{}
	if existing != nil {
		in.Existing = []*discoveryv1.EndpointSlice{existing}
		byName[existing.Name] = existing
	}
	desired := Compute(in)
	p := Diff(r.Name, r.UID, node, desired, byName)
	StampTriggers(&p, desired, byName, now)
	written := append(append([]*discoveryv1.EndpointSlice{}, p.Create...), p.Update...)
	require.LessOrEqual(t, len(written), 1)
	for _, d := range desired {
		assert.NotContains(t, d.Slice.Annotations, TriggerAnnotation, "the desired slices stay as Compute made them")
	}
	if len(written) == 0 {
		return nil
	}
	return written[0]
}

func triggerOf(t *testing.T, s *discoveryv1.EndpointSlice) time.Time {
	t.Helper()
	require.NotNil(t, s, "a slice is written")
	v, ok := s.Annotations[TriggerAnnotation]
	require.True(t, ok, "every write carries %s", TriggerAnnotation)
	got, err := time.Parse(time.RFC3339Nano, v)
	require.NoError(t, err)
	return got
}

// Every slice write carries the time of the probe result that caused it, as kube-proxy measures
// its network programming latency from it; a write no probe result caused carries the time the
// agent saw the change.
func TestEverySliceWriteIsStampedWithTheProbeResultThatCausedIt(t *testing.T) {
	base := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return base.Add(time.Duration(s) * time.Second) }
	a, b := pod("a", 0, "198.18.0.1"), pod("b", 0, "198.18.0.2")

	// Created: the earliest decided endpoint of the slice.
	created := plan(t, []Pod{{Pod: a, Endpoints: smtpEndpoint(true, at(3))}, {Pod: b, Endpoints: smtpEndpoint(true, at(1))}}, nil, at(5))
	assert.Equal(t, at(1), triggerOf(t, created), "a new slice: the first of its endpoints' decisions")
	created.ResourceVersion = "1"

	// Nothing changed: no write, however late.
	assert.Nil(t, plan(t, []Pod{{Pod: a, Endpoints: smtpEndpoint(true, at(3))}, {Pod: b, Endpoints: smtpEndpoint(true, at(1))}}, created, at(60)))

	// b fails at 10 s: the write carries b's failing result, not a's older pass nor now.
	updated := plan(t, []Pod{{Pod: a, Endpoints: smtpEndpoint(true, at(3))}, {Pod: b, Endpoints: smtpEndpoint(false, at(10))}}, created, at(12))
	assert.Equal(t, at(10), triggerOf(t, updated), "an update: the changed endpoint's decision")

	// a drain changes b's conditions with no probe result of its own (its failure is older than
	// the last write): stamped with the time the agent saw it.
	drained := smtpEndpoint(true, at(3))
	drained[0].Ready, drained[0].Drained = false, true
	updated.ResourceVersion = "2"
	again := plan(t, []Pod{{Pod: a, Endpoints: drained}, {Pod: b, Endpoints: smtpEndpoint(false, at(10))}}, updated, at(20))
	assert.Equal(t, at(20), triggerOf(t, again), "a change older than the last write is not its cause")

	// A pod gone: no endpoint changes, the write is stamped now.
	gone := plan(t, []Pod{{Pod: a, Endpoints: drained}}, again, at(30))
	assert.Equal(t, at(30), triggerOf(t, gone), "an endpoint removed")

	// An undecided endpoint never published has no time: a new endpoint beside it is the cause.
	undecided := smtpEndpoint(false, time.Time{})
	undecided[0].Decided = false
	assert.Equal(t, at(40), triggerOf(t, plan(t, []Pod{{Pod: a, Endpoints: smtpEndpoint(true, at(40))}, {Pod: b, Endpoints: undecided}}, nil, at(41))))
}

// The stamp alone never makes a write: a slice whose only difference is an older trigger time
// is left as it is, and a retry on a newer version of the slice carries the new stamp.
func TestTheTriggerTimeAloneIsNoDifference(t *testing.T) {
	a := pod("a", 0, "198.18.0.1")
	now := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
	created := plan(t, []Pod{{Pod: a, Endpoints: smtpEndpoint(true, now)}}, nil, now)
	stale := created.DeepCopy()
	stale.Annotations[TriggerAnnotation] = now.Add(-time.Hour).Format(time.RFC3339Nano)
	merged, changed := Merge(stale, created)
	assert.False(t, changed, "only the stamp differs")
	assert.Same(t, stale, merged)

	other := created.DeepCopy()
	no := false
	other.Endpoints[0].Conditions.Ready = &no
	other.Annotations[TriggerAnnotation] = now.Add(time.Second).Format(time.RFC3339Nano)
	merged, changed = Merge(stale, other)
	assert.True(t, changed)
	assert.Equal(t, other.Annotations[TriggerAnnotation], merged.Annotations[TriggerAnnotation], "the write carries the new stamp")
}
