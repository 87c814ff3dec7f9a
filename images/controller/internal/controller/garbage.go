// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/childservice"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/gc"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/index"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/metrics"
)

// collectSlices deletes the garbage among the slices of a live resource. What the cache says is
// confirmed against the API server first: a resource or node created a moment ago may not be in
// the cache yet, and its fresh slices must not be deleted.
func (r *Reconciler) collectSlices(ctx context.Context, swh *v1alpha1.ServiceWithHealthchecks, sliceList []discoveryv1.EndpointSlice) error {
	nodes, err := r.existingNodes(ctx, sliceList)
	if err != nil {
		return err
	}
	candidates := gc.Decide(gc.Input{Resource: swh, Nodes: nodes, Slices: sliceList})
	if len(candidates) == 0 {
		return nil
	}
	return r.confirmAndDelete(ctx, types.NamespacedName{Namespace: swh.Namespace, Name: swh.Name}, candidates)
}

// collectOrphans handles a resource that is gone: its slices and a Service it controlled are
// deleted, once the API server confirms that the resource is gone.
func (r *Reconciler) collectOrphans(ctx context.Context, key types.NamespacedName) (ctrl.Result, error) {
	sliceList, err := r.listSlices(ctx, key.Namespace, key.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	svc, err := r.getService(ctx, key)
	if err != nil {
		return ctrl.Result{}, err
	}
	orphanService := svc != nil && childservice.ControlledByResource(svc, key.Name)
	candidates := gc.Decide(gc.Input{Slices: sliceList})
	if len(candidates) == 0 && !orphanService {
		return ctrl.Result{}, nil
	}
	fresh, err := r.freshResource(ctx, key)
	if err != nil {
		return ctrl.Result{}, err
	}
	if fresh != nil {
		// The cache lags: the resource exists and its own event will reconcile it.
		return ctrl.Result{}, nil
	}
	var errs []error
	if len(candidates) > 0 {
		errs = append(errs, r.confirmAndDelete(ctx, key, candidates))
	}
	if orphanService {
		err := r.services.CoreV1().Services(svc.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &svc.UID}})
		switch {
		case err == nil:
			r.metrics.ServiceWrites.WithLabelValues(metrics.OpDeleteService).Inc()
			ctrl.LoggerFrom(ctx).Info("deleted the Service of a deleted resource", "service", key)
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone already, or replaced by a new Service that is not this garbage.
		default:
			r.metrics.Errors.WithLabelValues(metrics.OpDeleteService).Inc()
			errs = append(errs, fmt.Errorf("deleting Service %s of a deleted resource: %w", key, err))
		}
	}
	return ctrl.Result{}, errors.Join(errs...)
}

// confirmAndDelete decides again from the API server's own view of the resource and of the nodes
// the candidates name, and deletes what is still garbage.
func (r *Reconciler) confirmAndDelete(ctx context.Context, key types.NamespacedName, candidates []gc.Garbage) error {
	fresh, err := r.freshResource(ctx, key)
	if err != nil {
		return err
	}
	nodes := sets.New[string]()
	for _, c := range candidates {
		if c.Reason != gc.NodeDeleted {
			continue
		}
		name := slicemeta.NodeOf(c.Slice)
		if name == "" || nodes.Has(name) {
			continue
		}
		exists, err := r.nodeExists(ctx, name)
		if err != nil {
			return err
		}
		if exists {
			nodes.Insert(name)
		}
	}
	// Nodes that no candidate names are not in question: count them as existing.
	for _, c := range candidates {
		if n := slicemeta.NodeOf(c.Slice); c.Reason != gc.NodeDeleted && n != "" {
			nodes.Insert(n)
		}
	}
	sliceList := make([]discoveryv1.EndpointSlice, 0, len(candidates))
	for _, c := range candidates {
		sliceList = append(sliceList, *c.Slice)
	}
	var errs []error
	for _, g := range gc.Decide(gc.Input{Resource: fresh, Nodes: nodes, Slices: sliceList}) {
		errs = append(errs, r.deleteSlice(ctx, g))
	}
	return errors.Join(errs...)
}

// deleteSlice deletes the slice exactly as it was decided on, through the slice writer: the UID
// and resourceVersion preconditions make the delete fail if the slice changed since (an agent
// took it over for the live resource, DESIGN §5: the adopted slice must not go), and the
// change's own event brings the decision back with the new content.
func (r *Reconciler) deleteSlice(ctx context.Context, g gc.Garbage) error {
	deleted, err := r.sliceWriter.DeleteGarbage(ctx, g.Slice, string(g.Reason))
	if err != nil {
		return err
	}
	if !deleted {
		// Gone already, replaced by a slice of the same name, or changed since the decision:
		// not this garbage.
		ctrl.LoggerFrom(ctx).V(1).Info("a garbage EndpointSlice changed or went before its deletion; deciding again on its next event",
			"endpointSlice", client.ObjectKeyFromObject(g.Slice), "reason", string(g.Reason))
		return nil
	}
	ctrl.LoggerFrom(ctx).Info("deleted a garbage EndpointSlice", "endpointSlice", client.ObjectKeyFromObject(g.Slice),
		"reason", string(g.Reason), "node", slicemeta.NodeOf(g.Slice), "port", g.Slice.Labels[wellknown.LabelPort])
	if g.Reason == gc.NameNotItsNode {
		r.recordSquat(g.Slice)
	}
	return nil
}

// EventSliceNameSquatted is the reason of the Event of a deleted slice whose name is not its
// node's (gc.NameNotItsNode): the node that published it took a name of another node's slice.
const EventSliceNameSquatted = "EndpointSliceNameSquatted"

// recordSquat records the deletion of a slice whose name is not its node's, on its resource,
// naming the node that published it (the one to look at: its agent's token wrote it).
func (r *Reconciler) recordSquat(s *discoveryv1.EndpointSlice) {
	regarding := &v1alpha1.ServiceWithHealthchecks{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: slicemeta.ResourceOf(s), UID: slicemeta.OwnerUID(s)}}
	r.recorder.Eventf(regarding, s, corev1.EventTypeWarning, EventSliceNameSquatted, "DeleteSquattedSlice",
		"Deleted EndpointSlice %s published for node %q: its name is not one that node's agent gives a slice of port %q (it holds a name of another node's slice, which that node's agent could not publish)",
		s.Name, slicemeta.NodeOf(s), s.Labels[wellknown.LabelPort])
}

// freshResource reads the resource from the API server; nil when it does not exist.
func (r *Reconciler) freshResource(ctx context.Context, key types.NamespacedName) (*v1alpha1.ServiceWithHealthchecks, error) {
	var swh v1alpha1.ServiceWithHealthchecks
	if err := r.reader.Get(ctx, key, &swh); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		r.metrics.Errors.WithLabelValues(metrics.OpRead).Inc()
		return nil, fmt.Errorf("reading ServiceWithHealthchecks %s from the API server: %w", key, err)
	}
	return &swh, nil
}

func (r *Reconciler) nodeExists(ctx context.Context, name string) (bool, error) {
	node := &metav1.PartialObjectMetadata{}
	node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	if err := r.reader.Get(ctx, types.NamespacedName{Name: name}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		r.metrics.Errors.WithLabelValues(metrics.OpRead).Inc()
		return false, fmt.Errorf("reading node %s from the API server: %w", name, err)
	}
	return true, nil
}

// existingNodes are the nodes named by the slices (slicemeta.NodeOf) that exist in the cache:
// what gc.Decide needs to know, read by name rather than by listing every Node.
func (r *Reconciler) existingNodes(ctx context.Context, sliceList []discoveryv1.EndpointSlice) (sets.Set[string], error) {
	names := sets.New[string]()
	asked := sets.New[string]()
	for i := range sliceList {
		name := slicemeta.NodeOf(&sliceList[i])
		if name == "" || asked.Has(name) {
			continue
		}
		asked.Insert(name)
		node := &metav1.PartialObjectMetadata{}
		node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
		err := r.client.Get(ctx, types.NamespacedName{Name: name}, node)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			r.metrics.Errors.WithLabelValues(metrics.OpRead).Inc()
			return nil, fmt.Errorf("reading node %s: %w", name, err)
		default:
			names.Insert(name)
		}
	}
	return names, nil
}

// listSlices returns this module's slices published for the resource name in namespace, from
// the cache's index by resource. They are the cache's own objects, not copies (the slices of a
// resource on every node of a large cluster are many, and a reconcile only reads them): every
// caller must deep-copy a slice before changing it.
func (r *Reconciler) listSlices(ctx context.Context, namespace, name string) ([]discoveryv1.EndpointSlice, error) {
	var list discoveryv1.EndpointSliceList
	if err := r.client.List(ctx, &list, client.InNamespace(namespace), client.MatchingFields{index.SliceResource: name},
		client.UnsafeDisableDeepCopy); err != nil {
		r.metrics.Errors.WithLabelValues(metrics.OpRead).Inc()
		return nil, fmt.Errorf("listing the EndpointSlices of %s/%s: %w", namespace, name, err)
	}
	return list.Items, nil
}

func (r *Reconciler) getService(ctx context.Context, key types.NamespacedName) (*corev1.Service, error) {
	var svc corev1.Service
	if err := r.client.Get(ctx, key, &svc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		r.metrics.Errors.WithLabelValues(metrics.OpRead).Inc()
		return nil, fmt.Errorf("reading Service %s: %w", key, err)
	}
	return &svc, nil
}
