// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/metrics"
)

// BuiltinManagedBy is the managed-by label value of the built-in EndpointSlice controller
// (kube-controller-manager), whose slices of an adopted Service the controller deletes.
const BuiltinManagedBy = "endpointslice-controller.k8s.io"

// eventBuiltinSlicesDeleted is the Event reason of deleting an adopted Service's built-in slices.
const eventBuiltinSlicesDeleted = "BuiltinSlicesDeleted"

// isBuiltinSliceOf tells whether s is a slice the built-in EndpointSlice controller published
// for the Service svc: the Service name label, the built-in managed-by value and an owner
// reference to this very Service (its UID). Anything else is never deleted.
func isBuiltinSliceOf(s *discoveryv1.EndpointSlice, svc *corev1.Service) bool {
	if s.Labels[discoveryv1.LabelServiceName] != svc.Name || s.Labels[discoveryv1.LabelManagedBy] != BuiltinManagedBy {
		return false
	}
	for _, o := range s.OwnerReferences {
		if o.UID == svc.UID && o.Kind == "Service" {
			return true
		}
	}
	return false
}

// needsBuiltinSweep tells whether the built-in slices of the owned Service svc must be looked
// for: right after this reconcile cleared its selector, and once per controller process for an
// adopted Service (adopt annotation) without a selector, so that a controller that stopped
// between clearing the selector and deleting the slices (or a version that did not delete them)
// still deletes them; until a sweep finds nothing, every reconcile looks again. A Service with
// a selector is never swept: the built-in controller still manages its slices.
func (r *Reconciler) needsBuiltinSweep(svc *corev1.Service, justCleared bool) bool {
	if svc == nil || len(svc.Spec.Selector) > 0 {
		return false
	}
	if justCleared {
		return true
	}
	if svc.Annotations[wellknown.AnnotationAdopt] != "true" {
		return false
	}
	_, swept := r.builtinSwept.Load(svc.UID)
	return !swept
}

// deleteBuiltinSlices deletes the built-in EndpointSlices of the adopted Service svc, whose
// selector is cleared: the built-in EndpointSlice controller stops managing a Service without
// a selector and leaves its slices, which would keep routing to every selected pod whatever the
// probes say. It lists them from the API server (the informer sees only this module's slices)
// and deletes each through the slice writer with a UID precondition. Safe to repeat.
func (r *Reconciler) deleteBuiltinSlices(ctx context.Context, swh *v1alpha1.ServiceWithHealthchecks, svc *corev1.Service) error {
	var list discoveryv1.EndpointSliceList
	if err := r.reader.List(ctx, &list, client.InNamespace(svc.Namespace), client.MatchingLabels{
		discoveryv1.LabelServiceName: svc.Name,
		discoveryv1.LabelManagedBy:   BuiltinManagedBy,
	}); err != nil {
		r.metrics.Errors.WithLabelValues(metrics.OpRead).Inc()
		return fmt.Errorf("listing the built-in EndpointSlices of Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	var deleted []string
	for i := range list.Items {
		s := &list.Items[i]
		if !isBuiltinSliceOf(s, svc) {
			continue
		}
		// Gone already, or replaced by another object of the same name (not the one listed):
		// not deleted, and no error.
		ok, err := r.sliceWriter.DeleteBuiltin(ctx, s)
		if err != nil {
			return fmt.Errorf("deleting a built-in EndpointSlice of Service %s: %w", svc.Name, err)
		}
		if ok {
			deleted = append(deleted, s.Name)
		}
	}
	if len(deleted) == 0 {
		// Only a sweep that found nothing ends the looking: a built-in controller that had not
		// seen the cleared selector yet may have written a slice after the list above.
		r.builtinSwept.Store(svc.UID, struct{}{})
		return nil
	}
	ctrl.LoggerFrom(ctx).Info("deleted the built-in EndpointSlices of the adopted Service",
		"service", client.ObjectKeyFromObject(svc), "slices", deleted)
	r.recorder.Eventf(swh, nil, corev1.EventTypeNormal, eventBuiltinSlicesDeleted, "DeleteBuiltinSlices",
		"Deleted the built-in EndpointSlice(s) %s of Service %s: the built-in controller leaves them once the selector is cleared, and only this module's slices may route its traffic",
		strings.Join(deleted, ", "), svc.Name)
	return nil
}
