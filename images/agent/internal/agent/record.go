// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"fmt"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/publisher"
)

// record reports what the apply step did, never what it only meant to do: the transitions of
// the slices that were written (a failed write records nothing, and its retry records them),
// the slice names found held by someone else, and the endpoint gauges from the slices now in
// place.
func (r *Reconciler) record(o Observed, d Decision, written publisher.Result) {
	swh := o.Resource
	// The pod is the Event's related object. The recorder aggregates Events with the same
	// regarding and related object, type, reason and action into one Event with a series
	// (that is the rate limit, see development/AGENT.md); without the pod, one pod's transition
	// would be counted in another pod's Event and its message never shown.
	for _, ds := range d.Desired {
		if _, ok := written.Written[ds.Slice.Name]; !ok {
			continue
		}
		for _, t := range d.Transitions[ds.Slice.Name] {
			pod := t.Pod
			if t.Serving {
				r.Recorder.Eventf(swh, &pod, corev1.EventTypeNormal, ReasonPortReady, "Probe", "%s", noteOf(t))
			} else {
				r.Recorder.Eventf(swh, &pod, corev1.EventTypeWarning, ReasonPortNotReady, "Probe", "%s", noteOf(t))
			}
		}
	}
	for _, c := range written.Conflicts {
		r.Metrics.SliceConflicts.Inc()
		r.Recorder.Eventf(swh, nil, corev1.EventTypeWarning, ReasonSliceNameTaken, "Publish", "%s",
			capNote(fmt.Sprintf("EndpointSlice %s is held by %s; this agent does not write it", c.Name, c.Holder)))
	}

	counts := publishedCounts(o, d, written)
	res := types.NamespacedName{Namespace: swh.Namespace, Name: swh.Name}
	r.mu.Lock()
	if len(counts) == 0 {
		delete(r.published, res)
	} else {
		r.published[res] = counts
	}
	r.publishGaugesLocked()
	r.mu.Unlock()
}

// publishedCounts counts, by state, the endpoints of (resource, node) as they now are in the API
// server: a written slice with what was written, a slice the plan left alone or failed to update
// with its existing content, a name held by someone else or a failed create with nothing.
func publishedCounts(o Observed, d Decision, written publisher.Result) map[string]int {
	held := map[string]bool{}
	for _, c := range written.Conflicts {
		held[c.Name] = true
	}
	existing := map[string]*discoveryv1.EndpointSlice{}
	for _, s := range o.Slices {
		if slicemeta.IsOwnedBy(s, o.Resource.UID) && slicemeta.NodeOf(s) == o.Node {
			existing[s.Name] = s
		}
	}
	counts := map[string]int{}
	for _, ds := range d.Desired {
		name := ds.Slice.Name
		var in *discoveryv1.EndpointSlice
		switch {
		case held[name]:
		case written.Written[name] != nil:
			in = written.Written[name]
		case planned(d, name):
			in = existing[name] // the write failed: what was there is still there
		default:
			in = ds.Slice // unchanged
		}
		if in == nil {
			continue
		}
		for _, e := range in.Endpoints {
			switch {
			case e.Conditions.Terminating != nil && *e.Conditions.Terminating:
				counts[metrics.StateTerminating]++
			case e.Conditions.Ready == nil || *e.Conditions.Ready:
				counts[metrics.StateReady]++
			default:
				counts[metrics.StateNotReady]++
			}
		}
	}
	return counts
}

// planned tells whether the plan writes the slice of that name.
func planned(d Decision, name string) bool {
	for _, s := range d.Plan.Create {
		if s.Name == name {
			return true
		}
	}
	for _, s := range d.Plan.Update {
		if s.Name == name {
			return true
		}
	}
	return false
}

func (r *Reconciler) publishGaugesLocked() {
	total := map[string]int{}
	for _, c := range r.published {
		for k, v := range c {
			total[k] += v
		}
	}
	for _, s := range []string{metrics.StateReady, metrics.StateNotReady, metrics.StateTerminating} {
		r.Metrics.Endpoints.WithLabelValues(s).Set(float64(total[s]))
	}
}

// MaxNoteBytes is the longest Event note the events API accepts (1 KiB); longer notes are cut
// to it, or the API server would refuse the Event and the transition would go unreported.
const MaxNoteBytes = 1024

// noteOf is the note of a transition's Event: "pod db-1, port postgres: query returned false"
// ("pod db-1: ..." for a resource without ports), at most MaxNoteBytes long.
func noteOf(t Transition) string {
	where := "pod " + t.Pod.Name
	if t.Port != "" {
		where += ", port " + t.Port
	}
	if t.Serving {
		return capNote(where + ": probes pass")
	}
	return capNote(where + ": " + t.Reason)
}

// capNote cuts a note to MaxNoteBytes at a rune boundary, ending it with "…" when cut.
func capNote(s string) string {
	if len(s) <= MaxNoteBytes {
		return s
	}
	const ellipsis = "…"
	cut := MaxNoteBytes - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
