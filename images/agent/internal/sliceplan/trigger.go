// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package sliceplan

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// TriggerAnnotation is the annotation kube-proxy measures its network programming latency from
// (kubeproxy_network_programming_duration_seconds): the time of the change that caused the
// slice's write. The built-in EndpointSlice controller sets it from the pods' changes; the agent
// sets it from the probe result that caused the write (StampTriggers).
const TriggerAnnotation = corev1.EndpointsLastChangeTriggerTime

// StampTriggers sets TriggerAnnotation on every slice the plan creates or updates: the earliest
// time at which one of its changed endpoints (new, or with other conditions than the existing
// slice of that name lists) had its verdict decided, as kube-proxy's own latency is measured
// from the earliest change a write carries. A verdict decided before the existing slice's own
// trigger time was already published then, so this write was caused by something without a
// time of its own (a drain annotation, a pod gone, a relabel, a restart's takeover): such a
// write, and one that changes no endpoint's conditions, is stamped now, the time the agent
// saw the change. desired and existing are what the plan was made from (Diff); the plan's
// Create entries are replaced by copies, so the desired slices stay as Compute made them.
func StampTriggers(p *Plan, desired []Desired, existing map[string]*discoveryv1.EndpointSlice, now time.Time) {
	if len(p.Create)+len(p.Update) == 0 {
		return
	}
	byName := make(map[string]*Desired, len(desired))
	for i := range desired {
		byName[desired[i].Slice.Name] = &desired[i]
	}
	for i, s := range p.Create {
		c := *s
		c.Annotations = make(map[string]string, len(s.Annotations)+1)
		for k, v := range s.Annotations {
			c.Annotations[k] = v
		}
		c.Annotations[TriggerAnnotation] = trigger(&c, byName[s.Name], existing[s.Name], now).Format(time.RFC3339Nano)
		p.Create[i] = &c
	}
	// Update entries are Merge's copies: their annotations are theirs to change.
	for _, s := range p.Update {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[TriggerAnnotation] = trigger(s, byName[s.Name], existing[s.Name], now).Format(time.RFC3339Nano)
	}
}

// trigger is the trigger time of writing s (see StampTriggers); d is its desired slice (nil when
// not known), cur the existing one (nil when s is created).
func trigger(s *discoveryv1.EndpointSlice, d *Desired, cur *discoveryv1.EndpointSlice, now time.Time) time.Time {
	if d == nil || len(d.Changed) != len(s.Endpoints) {
		return now
	}
	var since time.Time
	var before map[endpointID]discoveryv1.EndpointConditions
	if cur != nil {
		since, _ = time.Parse(time.RFC3339Nano, cur.Annotations[TriggerAnnotation])
		before = make(map[endpointID]discoveryv1.EndpointConditions, len(cur.Endpoints))
		for _, e := range cur.Endpoints {
			before[idOf(&e)] = e.Conditions
		}
	}
	var first time.Time
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if c, ok := before[idOf(e)]; ok && sameConditions(c, e.Conditions) {
			continue
		}
		t := d.Changed[i]
		if t.IsZero() || !t.After(since) || t.After(now) {
			t = now
		}
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	if first.IsZero() {
		return now
	}
	return first
}

// endpointID is an endpoint by its first address and its pod.
type endpointID struct {
	address string
	pod     types.UID
}

func idOf(e *discoveryv1.Endpoint) endpointID {
	var id endpointID
	if len(e.Addresses) > 0 {
		id.address = e.Addresses[0]
	}
	if e.TargetRef != nil {
		id.pod = e.TargetRef.UID
	}
	return id
}

func sameConditions(a, b discoveryv1.EndpointConditions) bool {
	return ptr.Equal(a.Ready, b.Ready) && ptr.Equal(a.Serving, b.Serving) && ptr.Equal(a.Terminating, b.Terminating)
}
