// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/publisher"
	"github.com/deckhouse/service-with-healthchecks/lib/eventnote"
)

// record reports what the apply step did, never what it only meant to do: the transitions of
// the slices that were written (a failed write records nothing, and its retry records them),
// the slice names found held by someone else, and the endpoint gauges from the slices now in
// place.
func (r *Reconciler) record(o Observed, d Decision, written publisher.Result) {
	swh := o.Resource
	var happened []Transition
	for _, ds := range d.Desired {
		if _, ok := written.Written[ds.Slice.Name]; !ok {
			continue
		}
		for _, t := range d.Transitions[ds.Slice.Name] {
			happened = append(happened, t)
			if t.Drain != DrainNone {
				continue
			}
			state := "not_serving"
			if t.Serving {
				state = "serving"
			}
			r.Metrics.PortTransitions.WithLabelValues(state).Inc()
		}
	}
	r.reportTransitions(swh, happened, len(written.Written))
	for _, c := range written.Conflicts {
		r.Metrics.SliceConflicts.Inc()
		r.Recorder.Eventf(swh, nil, corev1.EventTypeWarning, ReasonSliceNameTaken, "Publish", "%s",
			capNote(fmt.Sprintf("EndpointSlice %s is held by %s; this agent does not write it", c.Name, c.Holder)))
	}

	r.gauges.set(types.NamespacedName{Namespace: swh.Namespace, Name: swh.Name}, publishedCounts(o, d, written))
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

// MaxNoteBytes is the longest Event note the events API accepts (1 KiB); longer notes are cut
// to it, or the API server would refuse the Event and the transition would go unreported.
const MaxNoteBytes = eventnote.MaxBytes

// actionOf is the action of a transition's Event: base, then "/" and the port. client-go's
// events broadcaster merges the Events of one type, action, reason, regarding and related object
// into a series of the first one, which keeps the first note: with the action alone, a pod's
// second port going out within minutes of its first was only a count on the first port's Event
// (its note, naming the other port, was lost). The port in the action keeps the series per pod
// and port, as the rate limit means (development/AGENT.md, "Events"). Port names are at most 15
// characters, far within the action's 128.
func actionOf(base string, t Transition) string {
	if t.Port == "" {
		return base
	}
	return base + "/" + t.Port
}

// noteOf is the note of a transition's Event: "pod db-1, port postgres: query returned false"
// ("pod db-1: ..." for a resource without ports), at most MaxNoteBytes long.
func noteOf(t Transition) string {
	where := "pod " + t.Pod.Name
	if t.Port != "" {
		where += ", port " + t.Port
	}
	return capNote(where + ": " + whatHappened(t))
}

// whatHappened is the part of a transition's note after the pod and port.
func whatHappened(t Transition) string {
	switch {
	case t.Drain == DrainStarted:
		return portrule.ReasonDrained + ": existing connections continue, new ones go to other pods"
	case t.Drain == DrainEnded:
		return "the drain annotation no longer names it: published on its probe verdict again"
	case t.Serving && t.Drained:
		return "probes pass; " + portrule.ReasonDrained + ": no new connections until the annotation is removed"
	case t.Serving:
		return "probes pass"
	}
	return t.Reason
}

// capNote cuts a note to MaxNoteBytes at a rune boundary, ending it with "…" when cut
// (lib/eventnote.Cap; the agent's recorder caps every note too).
func capNote(s string) string {
	return eventnote.Cap(s)
}

// minOneByOne is how many transitions of a window are always reported one Event each; more than
// that, and more than the slice writes that carried them, are reported in one summary Event.
const minOneByOne = 5

// reportTransitions reports the transitions of a resource, on a budget: Event writes follow
// slice writes, not transitions. Alone in its window a transition is reported at once, as one
// Event with the pod as related object (the recorder aggregates repeats of a pod and reason
// into a series: development/AGENT.md). The transitions that follow within the window are
// reported when it ends (a reconcile is queued for then): one Event each while they are few
// (at most minOneByOne, or at most the slice writes that carried them), else one summary Event
// with the counts. Every transition is counted in swh_agent_port_transitions_total.
func (r *Reconciler) reportTransitions(swh *v1alpha1.ServiceWithHealthchecks, happened []Transition, writes int) {
	res := types.NamespacedName{Namespace: swh.Namespace, Name: swh.Name}
	batch, budget, wait, now := r.windows.add(res, happened, writes)
	if wait > 0 {
		// Queued again by every reconcile that finds the window open: the work queue keeps one
		// waiting entry per resource, the earliest, so a coalesced result change may have taken
		// the place of an earlier request for the window's end.
		if q := r.queue.get(); q != nil {
			q.AddAfter(reconcile.Request{NamespacedName: res}, wait)
		}
		return
	}
	if len(batch) == 0 {
		return
	}

	if len(batch) <= max(minOneByOne, budget) {
		for _, t := range batch {
			pod := t.Pod
			switch {
			case t.Drain != DrainNone:
				r.Recorder.Eventf(swh, &pod, corev1.EventTypeNormal, drainReason(t), actionOf("Drain", t), "%s", noteOf(t))
			case t.Serving:
				r.Recorder.Eventf(swh, &pod, corev1.EventTypeNormal, ReasonPortReady, actionOf("Probe", t), "%s", noteOf(t))
			default:
				r.Recorder.Eventf(swh, &pod, corev1.EventTypeWarning, ReasonPortNotReady, actionOf("Probe", t), "%s", noteOf(t))
			}
			r.Metrics.TransitionEvents.WithLabelValues("one").Inc()
		}
	} else {
		r.summarize(swh, batch, now)
	}
	r.reportDrainsOnPods(swh, batch)
}

// summarize writes one Event with the counts of a window's transitions and the first of them.
// It is written directly, not through the recorder, whose aggregation would keep the first
// summary's note and hide the counts of the next ones.
func (r *Reconciler) summarize(swh *v1alpha1.ServiceWithHealthchecks, batch []Transition, now time.Time) {
	ev := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Namespace: swh.Namespace, Name: fmt.Sprintf("%s.%x", swh.Name, now.UnixNano())},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: ControllerName,
		ReportingInstance:   r.reportingInstance(),
		Action:              "Probe",
		Reason:              ReasonPortsChanged,
		Regarding:           corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: wellknown.Kind, Namespace: swh.Namespace, Name: swh.Name, UID: swh.UID, ResourceVersion: swh.ResourceVersion},
		Type:                corev1.EventTypeNormal,
		Note:                summaryNote(batch, EventWindow),
	}
	for _, t := range batch {
		if !t.Serving && t.Drain == DrainNone {
			ev.Type = corev1.EventTypeWarning
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Client.Create(ctx, ev); err != nil {
		r.Log.Error(err, "writing a summary Event of port transitions", "swh", client.ObjectKeyFromObject(swh))
		return
	}
	r.Metrics.TransitionEvents.WithLabelValues("summary").Inc()
}

// reportingInstance names this agent in the Events it writes itself (128 characters at most).
func (r *Reconciler) reportingInstance() string {
	inst := ControllerName + "-" + r.Node
	if len(inst) > 128 {
		inst = ControllerName + "-" + wellknown.NodeDigest(r.Node)
	}
	return inst
}

// summaryNote is the note of a summary: the counts, then as many transitions as fit in
// MaxNoteBytes ("12 port transitions within 2s: 7 stopped serving, 5 serve again. pod a, port
// http: probe 0 (HTTP): HTTP 503; ... (and 9 more)").
func summaryNote(batch []Transition, window time.Duration) string {
	var down, up, drained, undrained int
	for _, t := range batch {
		switch {
		case t.Drain == DrainStarted:
			drained++
		case t.Drain == DrainEnded:
			undrained++
		case t.Serving:
			up++
		default:
			down++
		}
	}
	head := fmt.Sprintf("%d port transitions within %s: %d stopped serving, %d serve again", len(batch), window, down, up)
	if drained+undrained > 0 {
		head += fmt.Sprintf(", %d drained, %d undrained", drained, undrained)
	}
	head += "."
	var b strings.Builder
	b.WriteString(head)
	for i, t := range batch {
		more := fmt.Sprintf(" (and %d more)", len(batch)-i)
		part := " " + noteOf(t) + ";"
		if b.Len()+len(part)+len(more) > MaxNoteBytes {
			b.WriteString(more)
			return capNote(b.String())
		}
		b.WriteString(part)
	}
	return capNote(strings.TrimSuffix(b.String(), ";"))
}
