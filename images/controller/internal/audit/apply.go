// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/slicewrite"
)

// MaxNote is the most bytes of an Event note the audit writes: the events API refuses a note
// over 1 KiB, and the Event that names the node must not be lost for a long list.
const MaxNote = 1000

// apply deletes the forged slice, then records the Events (on the slice's resource and on the
// node) and counts. A delete that conflicts (the slice was rewritten since it was read: a
// forger rewriting it every second) reads the latest version again and, when it still repeats
// a forgery confirmed for the node, deletes it whatever its resourceVersion (UID precondition
// only): no rewrite outruns the delete. A slice gone, replaced, or rewritten clean meanwhile is
// left to its own next audit.
func (a *Auditor) apply(ctx context.Context, s *discoveryv1.EndpointSlice, in Input, v verdict) error {
	deleted, err := a.Deleter.DeleteForged(ctx, s, slicewrite.SameVersion)
	if err != nil {
		return err
	}
	if !deleted {
		latest, err := a.rejudge(ctx, s, in)
		if err != nil || latest == nil {
			return err
		}
		if deleted, err = a.Deleter.DeleteForged(ctx, latest, slicewrite.SameObject); err != nil || !deleted {
			return err
		}
		s = latest
	}
	a.report(ctx, s, in.Node, v)
	return nil
}

// rejudge reads slice s again from the API server and returns it when it is the same object,
// of the same node, and still repeats a forgery confirmed for the node; nil otherwise.
func (a *Auditor) rejudge(ctx context.Context, s *discoveryv1.EndpointSlice, in Input) (*discoveryv1.EndpointSlice, error) {
	var latest discoveryv1.EndpointSlice
	err := a.API.Get(ctx, client.ObjectKeyFromObject(s), &latest)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading EndpointSlice %s/%s again after a conflict: %w", s.Namespace, s.Name, err)
	}
	if latest.UID != s.UID || slicemeta.NodeOf(&latest) != in.Node || latest.DeletionTimestamp != nil {
		return nil, nil
	}
	again := in
	again.Endpoints, again.Ports = latest.Endpoints, latest.Ports
	for _, f := range Decide(again) {
		if a.confirm.isKnown(in.Node, in.Namespace, f) {
			return &latest, nil
		}
	}
	return nil, nil
}

// report records the Events of a deleted forged slice and logs it: on the resource (related:
// the slice) the slice, its node and each forged endpoint; on the Node, that it forged (a fresh
// confirmation) or repeated a forgery confirmed earlier. Notes are capped at MaxNote.
func (a *Auditor) report(ctx context.Context, s *discoveryv1.EndpointSlice, node string, v verdict) {
	parts := make([]string, 0, len(v.confirmed))
	for _, f := range v.confirmed {
		if f.Pod == "" && f.Address == "" {
			parts = append(parts, f.Reason)
			continue
		}
		parts = append(parts, fmt.Sprintf("endpoint %s (pod %q): %s", f.Address, f.Pod, f.Reason))
	}
	var regarding runtime.Object = s
	if ref, ok := slicemeta.ResourceRef(s.OwnerReferences); ok {
		regarding = &v1alpha1.ServiceWithHealthchecks{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: ref.Name, UID: ref.UID}}
	}
	repeat := ""
	if len(v.repeated) > 0 {
		repeat = " (repeats a forgery confirmed earlier for the node: deleted at once)"
	}
	a.Recorder.Eventf(regarding, s, corev1.EventTypeWarning, EventForged, "DeleteForgedSlice", "%s",
		capNote(fmt.Sprintf("Deleted EndpointSlice %s published for node %q%s: ", s.Name, node, repeat), parts))
	nodeObj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	if len(v.repeated) < len(v.confirmed) {
		a.Recorder.Eventf(nodeObj, s, corev1.EventTypeWarning, EventForged, "ConfirmForgery", "%s",
			capNote(fmt.Sprintf("Node %s published forged endpoints in EndpointSlice %s/%s, deleted; its slices that repeat them are deleted at once: ",
				node, s.Namespace, s.Name), parts))
	} else {
		a.Recorder.Eventf(nodeObj, s, corev1.EventTypeWarning, EventForged, "DeleteRepeatedForgery", "%s",
			capNote(fmt.Sprintf("Node %s repeated a confirmed forgery in EndpointSlice %s/%s, deleted at once: ", node, s.Namespace, s.Name), parts))
	}
	ctrl.LoggerFrom(ctx).Info("deleted a forged EndpointSlice", "slice", s.Name, "node", node, "repeated", len(v.repeated) > 0,
		"endpoints", parts[:min(len(parts), 20)], "forgedEndpoints", len(parts))
}

// capNote is prefix followed by parts joined with "; ", cut before MaxNote bytes with
// "; and N more".
func capNote(prefix string, parts []string) string {
	var b strings.Builder
	b.WriteString(prefix)
	for i, p := range parts {
		more := fmt.Sprintf("; and %d more", len(parts)-i)
		sep := ""
		if i > 0 {
			sep = "; "
		}
		if b.Len()+len(sep)+len(p)+len(more) > MaxNote {
			if b.Len()+len(more) > MaxNote {
				return b.String()[:MaxNote-len(more)] + more
			}
			b.WriteString(more)
			return b.String()
		}
		b.WriteString(sep)
		b.WriteString(p)
	}
	if b.Len() > MaxNote {
		return b.String()[:MaxNote]
	}
	return b.String()
}
