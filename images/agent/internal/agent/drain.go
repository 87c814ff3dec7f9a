// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
	"github.com/deckhouse/service-with-healthchecks/lib/eventnote"
)

// drainReason is the Event reason of a drain transition.
func drainReason(t Transition) string {
	if t.Drain == DrainStarted {
		return ReasonDrained
	}
	return ReasonUndrained
}

// reportDrainsOnPods reports the drain transitions of a batch on their pods too (kubectl
// describe pod shows the Events regarding the pod): one Event per pod and change, naming the
// resource and the ports. Drains follow annotation writes, so these are as rare as those.
func (r *Reconciler) reportDrainsOnPods(swh *v1alpha1.ServiceWithHealthchecks, batch []Transition) {
	type key struct {
		pod    string
		change DrainChange
	}
	var order []key
	ports := map[key][]string{}
	refs := map[key]corev1.ObjectReference{}
	for _, t := range batch {
		if t.Drain == DrainNone {
			continue
		}
		k := key{t.Pod.Name, t.Drain}
		if _, ok := refs[k]; !ok {
			order = append(order, k)
			refs[k] = t.Pod
		}
		if t.Port != "" {
			ports[k] = append(ports[k], t.Port)
		}
	}
	for _, k := range order {
		pod := refs[k]
		// The action names the ports (Drain/<ports>): Events of the same pod, resource and
		// reason but other ports are other Events, not a series of the first one's note.
		r.Recorder.Eventf(&pod, swh, corev1.EventTypeNormal, drainReason(Transition{Drain: k.change}), drainAction(ports[k]), "%s",
			podDrainNote(swh.Name, ports[k], k.change))
	}
}

// podDrainNote is the note of a drain Event on a pod: "ServiceWithHealthchecks web, ports http,
// metrics: drained by annotation ...".
func podDrainNote(resource string, ports []string, change DrainChange) string {
	where := wellknown.Kind + " " + resource
	switch len(ports) {
	case 0:
	case 1:
		where += ", port " + ports[0]
	default:
		where += ", ports " + strings.Join(ports, ", ")
	}
	return capNote(where + ": " + whatHappened(Transition{Drain: change}))
}

// drainWatch checks the drain annotation of this node's pods when it appears or changes, and
// reports what cannot be applied as an Event on the pod (reconciles are the Pod watch's own).
func (r *Reconciler) drainWatch() handler.EventHandler {
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.checkDrain(ctx, nil, e.Object)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.checkDrain(ctx, e.ObjectOld, e.ObjectNew)
		},
	}
}

// checkDrain reports, once per value, a drain annotation of a pod of this node that has
// problems (ParseDrain's, and entries naming no resource or port of the pod's namespace).
func (r *Reconciler) checkDrain(ctx context.Context, old, cur client.Object) {
	pod, ok := cur.(*corev1.Pod)
	if !ok || pod.Spec.NodeName != r.Node {
		return
	}
	value, ok := pod.Annotations[wellknown.AnnotationDrain]
	if !ok {
		return
	}
	if old != nil {
		if was, ok := old.GetAnnotations()[wellknown.AnnotationDrain]; ok && was == value {
			return
		}
	}
	d, problems := portrule.ParseDrain(value)
	if len(d.Entries) > 0 {
		var list v1alpha1.ServiceWithHealthchecksList
		if err := r.Client.List(ctx, &list, client.InNamespace(pod.Namespace)); err != nil {
			r.Log.Error(err, "listing resources to check a drain annotation", "pod", client.ObjectKeyFromObject(pod))
			return
		}
		ports := make(map[string][]v1alpha1.ServicePort, len(list.Items))
		for i := range list.Items {
			ports[list.Items[i].Name] = list.Items[i].Spec.Ports
		}
		problems = append(problems, d.Unknown(ports)...)
	}
	if len(problems) == 0 {
		return
	}
	// The action is keyed by the value and its problems (Drain/invalid/<digest>): a later value
	// with other problems is another Event, not a series of the first one's note.
	r.Recorder.Eventf(pod, nil, corev1.EventTypeWarning, ReasonDrainInvalid, eventnote.Action("Drain", "invalid", value+"\n"+strings.Join(problems, "\n")),
		"%s", drainProblemNote(value, problems))
}

// drainAction is the action of a drain Event on a pod: Drain/<ports, comma-separated>, or Drain
// for a resource without ports (lib/eventnote.Action bounds it).
func drainAction(ports []string) string {
	if len(ports) == 0 {
		return "Drain"
	}
	return eventnote.Action("Drain", strings.Join(ports, ","))
}

// maxQuotedValue bounds how much of an annotation's value a note quotes.
const maxQuotedValue = 200

// drainProblemNote is the note of a DrainInvalid Event.
func drainProblemNote(value string, problems []string) string {
	if len(value) > maxQuotedValue {
		value = value[:maxQuotedValue] + "…"
	}
	return capNote(fmt.Sprintf("annotation %s=%q is not applied in part or at all: %s (valid: %q, or a comma-separated list of resource and resource/port names)",
		wellknown.AnnotationDrain, value, strings.Join(problems, "; "), wellknown.DrainAll))
}
