// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/scheduler"
)

// SetupWithManager registers the reconciler and what it watches: the resources, this node's
// pods (a pod enqueues the resources whose selectors match its old or new labels), this
// module's slices of this node, this agent's own Node (its zone), and, through a raw source,
// the probe result and credential Secret changes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	err := ctrl.NewControllerManagedBy(mgr).
		Named("agent").
		// Failed writes (an API outage) are retried at most 30 s apart, so the agent publishes
		// soon after the API server is back, not after controller-runtime's 16-minute maximum.
		WithOptions(controller.Options{RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](100*time.Millisecond, MaxRetryDelay)}).
		// A status write of the controller (the per-port counts change with every flip)
		// reconciles nothing on the agents, except when it changes the ownership signal.
		For(&v1alpha1.ServiceWithHealthchecks{}, builder.WithPredicates(resourceChanged)).
		// The map function runs for the old and the new pod of an update, so a pod whose labels
		// stop matching is withdrawn by the resource it left.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.resourcesOfPod)).
		// A drain annotation that appears or changes is checked once, and what of it cannot be
		// applied is reported on the pod (the reconciles above apply the rest).
		Watches(&corev1.Pod{}, r.drainWatch()).
		// The event of a slice write of this agent's own reconciles nothing: the reconcile that
		// wrote it decided from everything the write carries.
		Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(r.resourceOfSlice),
			builder.WithPredicates(predicate.Funcs{
				CreateFunc: func(e event.CreateEvent) bool { return !r.ownWrites.consume(e.Object) },
				UpdateFunc: func(e event.UpdateEvent) bool { return !r.ownWrites.consume(e.ObjectNew) },
				DeleteFunc: func(e event.DeleteEvent) bool {
					r.ownWrites.consume(e.Object)
					return true
				},
			})).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.resourcesOfNode),
			builder.WithPredicates(predicate.Funcs{
				// The cache holds this agent's Node only. Its appearance lets every resource
				// publish; a new zone label rewrites the zone hints of its slices.
				CreateFunc: func(event.CreateEvent) bool { return true },
				UpdateFunc: func(e event.UpdateEvent) bool {
					return e.ObjectOld.GetLabels()[corev1.LabelTopologyZone] != e.ObjectNew.GetLabels()[corev1.LabelTopologyZone]
				},
				DeleteFunc:  func(event.DeleteEvent) bool { return false },
				GenericFunc: func(event.GenericEvent) bool { return false },
			})).
		WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			r.queue.set(q)
			return nil
		})).
		Complete(r)
	if err != nil {
		return fmt.Errorf("creating the agent controller: %w", err)
	}
	return nil
}

// resourceChanged lets through the resource events an agent acts on: creation, deletion, and
// updates of the spec (generation), of the deletion timestamp or of the ownership signal
// (Status.ServiceOwned); the controller's other status writes are ignored.
var resourceChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		old, okOld := e.ObjectOld.(*v1alpha1.ServiceWithHealthchecks)
		cur, okNew := e.ObjectNew.(*v1alpha1.ServiceWithHealthchecks)
		if !okOld || !okNew {
			return true
		}
		return old.Generation != cur.Generation ||
			(old.DeletionTimestamp == nil) != (cur.DeletionTimestamp == nil) ||
			old.Status.ServiceOwned() != cur.Status.ServiceOwned()
	},
}

// resultChanged is the scheduler's OnChange: it enqueues the resource, coalesced (see
// enqueueChange).
func (r *Reconciler) resultChanged(c scheduler.Change) {
	r.enqueueChange(c.Key.Resource)
}

// secretChanged re-evaluates the resources that reference a credential Secret.
func (r *Reconciler) secretChanged(secret types.NamespacedName) {
	for _, res := range r.refs.referencing(secret) {
		r.enqueueChange(res)
	}
}

// enqueueChange enqueues the resource of a change, coalesced by a budget per resource (Burst
// queueings, one regained every Window): a change is queued at once while the budget lasts, so
// a change right after a write is published without waiting; once it is spent, the changes
// that follow are queued together for the time the budget has a queueing again (the work
// queue keeps one entry per resource and the earliest time). A flap storm makes Burst
// reconciles and then about one per window. A window since the last queueing alone (a budget
// of one) made every second change of a resource within 200 ms wait for the window's end:
// the publish latency's p99 (development/AGENT.md, "Writing").
func (r *Reconciler) enqueueChange(res types.NamespacedName) {
	q := r.queue.get()
	if q == nil {
		return
	}
	req := reconcile.Request{NamespacedName: res}
	if d := r.coalescer.Next(res); d > 0 {
		q.AddAfter(req, d)
	} else {
		q.Add(req)
	}
}

// resourcesOfPod maps a pod of this node to the resources of its namespace that select it.
func (r *Reconciler) resourcesOfPod(ctx context.Context, o client.Object) []reconcile.Request {
	pod, ok := o.(*corev1.Pod)
	if !ok || pod.Spec.NodeName != r.Node {
		return nil
	}
	var list v1alpha1.ServiceWithHealthchecksList
	if err := r.Client.List(ctx, &list, client.InNamespace(pod.Namespace)); err != nil {
		r.Log.Error(err, "listing resources for a pod", "pod", client.ObjectKeyFromObject(pod))
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		if swh := &list.Items[i]; selects(swh, pod) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(swh)})
		}
	}
	return out
}

// resourceOfSlice maps a slice of this node to the resource it was published for.
func (r *Reconciler) resourceOfSlice(_ context.Context, o client.Object) []reconcile.Request {
	s, ok := o.(*discoveryv1.EndpointSlice)
	if !ok || slicemeta.NodeOf(s) != r.Node {
		return nil
	}
	name := slicemeta.ResourceOf(s)
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: s.Namespace, Name: name}}}
}

// resourcesOfNode maps this agent's Node to the resources to reconcile: all of them when the
// Node appears (nothing was published before it could be read), else those with a slice on it.
func (r *Reconciler) resourcesOfNode(ctx context.Context, o client.Object) []reconcile.Request {
	if o.GetName() != r.Node {
		return nil
	}
	seen := map[types.NamespacedName]bool{}
	var out []reconcile.Request
	add := func(key types.NamespacedName) {
		if key.Name != "" && !seen[key] {
			seen[key] = true
			out = append(out, reconcile.Request{NamespacedName: key})
		}
	}
	var onNode discoveryv1.EndpointSliceList
	if err := r.Client.List(ctx, &onNode, client.MatchingFields{indexNode: r.Node}); err != nil {
		r.Log.Error(err, "listing the slices of this node", "node", r.Node)
	}
	for i := range onNode.Items {
		add(types.NamespacedName{Namespace: onNode.Items[i].Namespace, Name: slicemeta.ResourceOf(&onNode.Items[i])})
	}
	if r.nodeWait.take() {
		var list v1alpha1.ServiceWithHealthchecksList
		if err := r.Client.List(ctx, &list); err != nil {
			r.Log.Error(err, "listing resources after the Node appeared")
		}
		for i := range list.Items {
			add(client.ObjectKeyFromObject(&list.Items[i]))
		}
	}
	return out
}
