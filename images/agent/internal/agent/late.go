// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/lib/eventnote"
)

// ReasonProbesLate is the reason of the Warning Event on a resource whose probes start more than
// one period late on this node.
const ReasonProbesLate = "ProbesLate"

// lateLookupTimeout bounds the cache read of probesLate, which runs on a probe worker.
const lateLookupTimeout = time.Second

// probesLate records that a probe of the resource started more than one period after it was due
// (the scheduler calls it from a worker, at most once a minute per resource). The Event is the
// resource's own: the status stays the controller's, and the endpoints keep the verdicts their
// probes gave until the next runs (lateness alone decides nothing).
func (r *Reconciler) probesLate(resource types.NamespacedName, lateness time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), lateLookupTimeout)
	defer cancel()
	var swh v1alpha1.ServiceWithHealthchecks
	if err := r.Client.Get(ctx, resource, &swh); err != nil {
		// Deleted meanwhile, or the cache cannot answer: the log line of the scheduler stays.
		r.Log.V(1).Info("not recording late probes", "swh", resource, "error", err.Error())
		return
	}
	// The action names the lateness (Probe/late/<lateness>), the one part of the note that
	// changes: a later Event is another Event, not a series of the first one's note.
	late := lateness.Round(time.Millisecond)
	r.Recorder.Eventf(&swh, nil, corev1.EventTypeWarning, ReasonProbesLate, lateAction(late),
		"probes on node %s start more than one period late (this one by %s): the agent's probe workers are taken, by probes of this namespace that do not answer until their timeout or by more probes than agent.probeConcurrency allows; the endpoints keep their last verdicts until the probes run",
		r.Node, late)
}

// lateAction is the action of a ProbesLate Event: Probe/late/<lateness>, the part of its note
// that changes.
func lateAction(lateness time.Duration) string {
	return eventnote.Action("Probe", "late", lateness.String())
}
