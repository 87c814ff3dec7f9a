// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package slicewrite is the controller's one EndpointSlice writer: garbage collection, the
// deletion of an adopted Service's built-in slices and the withdrawal of stale nodes' endpoints
// all write through a Writer, with one client, and its metrics live in the metrics package.
// The controller never creates a slice (the agents publish them); it deletes and, to withdraw,
// updates.
package slicewrite

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/metrics"
)

// Writer writes this program's EndpointSlices. It is safe for concurrent use.
type Writer struct {
	client   client.Writer
	metrics  *metrics.Metrics
	liveness *metrics.Liveness
}

// New returns the writer that writes through c and counts in m (the controller's metrics) and
// lm (the liveness metrics: withdrawals); either may be nil (nothing is counted there).
func New(c client.Writer, m *metrics.Metrics, lm *metrics.Liveness) *Writer {
	return &Writer{client: c, metrics: m, liveness: lm}
}

// Precondition says how exactly a delete must find the slice it was decided on.
type Precondition int

const (
	// SameVersion is the same object (UID) at the same resourceVersion: any change since the
	// decision makes the delete fail, and the change's own event brings the decision back.
	SameVersion Precondition = iota
	// SameObject is the same object (UID), whatever changed in it since.
	SameObject
)

// DeleteWithPreconditions deletes s as it was read: its UID and, for SameVersion, its
// resourceVersion are preconditions of the delete. It reports whether the slice was deleted; a
// slice that is gone already, or was replaced or changed since (a conflict), is not an error:
// deleted is false and err nil. It counts nothing: the callers below do, each for its purpose.
func (w *Writer) DeleteWithPreconditions(ctx context.Context, s *discoveryv1.EndpointSlice, p Precondition) (deleted bool, err error) {
	uid, rv := s.UID, s.ResourceVersion
	pre := client.Preconditions{UID: &uid}
	if p == SameVersion {
		pre.ResourceVersion = &rv
	}
	err = w.client.Delete(ctx, s, pre)
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return false, nil
	default:
		return false, fmt.Errorf("deleting EndpointSlice %s/%s: %w", s.Namespace, s.Name, err)
	}
}

// DeleteGarbage deletes a garbage slice exactly as it was decided on (SameVersion: an agent
// that took the slice over for a live resource since must keep it, DESIGN §5), counted by
// reason in swh_controller_garbage_collected_slices_total.
func (w *Writer) DeleteGarbage(ctx context.Context, s *discoveryv1.EndpointSlice, reason string) (bool, error) {
	return w.deleteCounted(ctx, s, SameVersion, metrics.OpDeleteSlice, func(m *metrics.Metrics) prometheus.Counter {
		return m.GarbageCollectedSlices.WithLabelValues(reason)
	})
}

// DeleteForged deletes a slice the audit found forged under p: SameVersion exactly as it was
// audited; SameObject once the audit has read the latest version again after a conflict and
// found it still forged (a forger rewriting the slice does not outrun the delete). Counted in
// swh_controller_forged_endpointslices_total.
func (w *Writer) DeleteForged(ctx context.Context, s *discoveryv1.EndpointSlice, p Precondition) (bool, error) {
	return w.deleteCounted(ctx, s, p, metrics.OpDeleteSlice, func(m *metrics.Metrics) prometheus.Counter {
		return m.ForgedSlices
	})
}

// DeleteRedundant deletes a slice the audit found redundant (it repeats endpoints of its group)
// under p, as DeleteForged does. Counted in swh_controller_redundant_endpointslices_total.
func (w *Writer) DeleteRedundant(ctx context.Context, s *discoveryv1.EndpointSlice, p Precondition) (bool, error) {
	return w.deleteCounted(ctx, s, p, metrics.OpDeleteSlice, func(m *metrics.Metrics) prometheus.Counter {
		return m.RedundantSlices
	})
}

// DeleteBuiltin deletes a built-in EndpointSlice of an adopted Service (SameObject: the
// built-in controller may still have touched it, and it must go all the same), counted in
// swh_controller_builtin_slices_deleted_total.
func (w *Writer) DeleteBuiltin(ctx context.Context, s *discoveryv1.EndpointSlice) (bool, error) {
	return w.deleteCounted(ctx, s, SameObject, metrics.OpDeleteBuiltinSlice, func(m *metrics.Metrics) prometheus.Counter {
		return m.BuiltinSlicesDeleted
	})
}

// deleteCounted deletes s under p and counts the outcome: an error under op in
// swh_controller_errors_total, a deletion in the counter done picks.
func (w *Writer) deleteCounted(ctx context.Context, s *discoveryv1.EndpointSlice, p Precondition, op string, done func(*metrics.Metrics) prometheus.Counter) (bool, error) {
	deleted, err := w.DeleteWithPreconditions(ctx, s, p)
	if m := w.metrics; m != nil {
		switch {
		case err != nil:
			m.Errors.WithLabelValues(op).Inc()
		case deleted:
			done(m).Inc()
		}
	}
	return deleted, err
}

// Withdraw writes s, a copy of a slice read at its resourceVersion whose endpoints were set to
// ready=false, serving=false (an update: it fails with a conflict if the slice changed since),
// counted in swh_controller_withdrawn_slices_total and withdrawn_endpoints_total, a failure in
// withdraw_errors_total.
func (w *Writer) Withdraw(ctx context.Context, s *discoveryv1.EndpointSlice) error {
	if err := w.client.Update(ctx, s); err != nil {
		if w.liveness != nil {
			w.liveness.Errors.Inc()
		}
		return fmt.Errorf("withdrawing EndpointSlice %s/%s: %w", s.Namespace, s.Name, err)
	}
	if m := w.liveness; m != nil {
		m.WithdrawnSlices.Inc()
		m.WithdrawnEndpoints.Add(float64(len(s.Endpoints)))
	}
	return nil
}
