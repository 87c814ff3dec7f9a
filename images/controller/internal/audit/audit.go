// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/metrics"
)

// podNodeField is the Pods' field selector by node, served by the API server.
const podNodeField = "spec.nodeName"

// OwnerRetry is how long the audit waits before it looks again at a slice whose owning
// resource its cache does not hold (yet).
const OwnerRetry = 5 * time.Second

// EventForged is the reason of the Event recorded when a forged slice is deleted.
const EventForged = "ForgedEndpointSlice"

// SliceDeleter deletes a slice only if it is still the object read (UID and resourceVersion
// preconditions): a slice rewritten or deleted since is audited again, not deleted blind
// (deleted false, err nil). The program's one slice writer (package slicewrite) is it, and
// counts the deletion.
type SliceDeleter interface {
	DeleteForged(ctx context.Context, s *discoveryv1.EndpointSlice) (deleted bool, err error)
}

// Auditor is the reconciler of this module's EndpointSlices.
type Auditor struct {
	// Client reads slices and resources from the manager's cache.
	Client client.Reader
	// Pods reads Pods uncached, from the API server: one LIST of the slice's node's Pods per
	// audit, then a GET of each Pod whose endpoint fails against it (the re-read before deciding).
	Pods client.Reader
	// Deleter deletes forged slices.
	Deleter SliceDeleter
	// Recorder records the ForgedEndpointSlice Event.
	Recorder events.EventRecorder
	// Metrics counts audits and deletions.
	Metrics *metrics.Metrics
	// Now is the clock of the confirmation window.
	Now func() time.Time

	confirm *confirmer
	// clean holds the slices a sibling's audit found clean (batch.go).
	clean *cleanSet
}

// Config tunes the audit.
type Config struct {
	// Window is the confirmation window (0: DefaultWindow).
	Window time.Duration
	// Now is the clock (nil: time.Now; tests inject theirs).
	Now func() time.Time
	// SkipNameValidation lets one process run several managers (tests).
	SkipNameValidation bool
	// Deleter deletes forged slices: the program's slice writer.
	Deleter SliceDeleter
	// WrapReader, when set (tests), wraps the cache reader of slices and resources.
	WrapReader func(client.Reader) client.Reader
}

// Setup registers the audit with mgr.
func Setup(mgr ctrl.Manager, m *metrics.Metrics, recorder events.EventRecorder, cfg Config) error {
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	var cached client.Reader = mgr.GetClient()
	if cfg.WrapReader != nil {
		cached = cfg.WrapReader(cached)
	}
	a := &Auditor{
		Client: cached, Pods: mgr.GetAPIReader(), Deleter: cfg.Deleter,
		Recorder: recorder, Metrics: m, Now: cfg.Now, confirm: newConfirmer(cfg.Window), clean: newCleanSet(),
	}
	err := ctrl.NewControllerManagedBy(mgr).
		Named("endpointsliceaudit").
		For(&discoveryv1.EndpointSlice{}).
		WithOptions(controller.Options{SkipNameValidation: ptr.To(cfg.SkipNameValidation)}).
		Complete(a)
	if err != nil {
		return fmt.Errorf("creating the EndpointSlice audit: %w", err)
	}
	return nil
}

// Reconcile audits one slice: observe (slice and resource from the cache, the node's Pods in one
// LIST from the API server, the suspects' Pods again one by one), decide, and once a mismatch has lasted the window, apply.
func (a *Auditor) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var s discoveryv1.EndpointSlice
	if err := a.Client.Get(ctx, req.NamespacedName, &s); err != nil {
		if apierrors.IsNotFound(err) {
			a.confirm.forget(req.NamespacedName)
			a.clean.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if !slicemeta.IsManaged(&s) || s.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	if a.clean.take(req.NamespacedName, version{uid: s.UID, rv: s.ResourceVersion}) {
		return ctrl.Result{}, nil // Audited clean at this version with a sibling (batch.go).
	}
	in, audited, err := a.observe(ctx, &s)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !audited {
		// The cache has no resource that owns the slice. Either there is none (the garbage
		// collector deletes the slice, and its deletion ends these retries) or the cache has not
		// seen it yet (a resource created just before its slice): look again rather than leave
		// the slice unaudited until its next change.
		return ctrl.Result{RequeueAfter: OwnerRetry}, nil
	}
	a.Metrics.AuditedSlices.Inc()
	confirmed, wait := a.confirm.observe(req.NamespacedName, s.UID, Decide(in), a.Now())
	if len(confirmed) == 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	return ctrl.Result{}, a.apply(ctx, &s, in.Node, confirmed)
}

// observe reads what Decide needs. audited is false when the slice's resource is gone or is
// not its owner: the garbage collector's case, not the audit's.
func (a *Auditor) observe(ctx context.Context, s *discoveryv1.EndpointSlice) (Input, bool, error) {
	var swh v1alpha1.ServiceWithHealthchecks
	err := a.Client.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: slicemeta.ResourceOf(s)}, &swh)
	if apierrors.IsNotFound(err) || (err == nil && !slicemeta.IsOwnedBy(s, swh.UID)) {
		return Input{}, false, nil
	}
	if err != nil {
		return Input{}, false, fmt.Errorf("reading the resource of slice %s/%s: %w", s.Namespace, s.Name, err)
	}
	in := Input{Namespace: s.Namespace, Node: slicemeta.NodeOf(s), Selector: swh.Spec.Selector, Endpoints: s.Endpoints}
	refs := PodRefs(s.Namespace, s.Endpoints)
	if len(refs) == 0 {
		in.Pods = map[string]*corev1.Pod{}
		return in, true, nil
	}
	if in.Pods, err = a.podsOnNode(ctx, s.Namespace, in.Node); err != nil {
		return Input{}, false, err
	}
	if err := a.reread(ctx, &in, refs); err != nil {
		return Input{}, false, err
	}
	// The same LIST audits the other slices of this namespace and node. A failure there costs
	// only the saving: each of them is still audited on its own.
	if err := a.auditSiblings(ctx, s, in.Node, in.Pods); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "auditing the other slices of the node with the same Pods")
	}
	return in, true, nil
}

// podsOnNode reads, in one uncached LIST, the Pods of the namespace bound to the slice's node:
// an honest slice names only those, so one request serves all its endpoints however many.
func (a *Auditor) podsOnNode(ctx context.Context, namespace, node string) (map[string]*corev1.Pod, error) {
	var list corev1.PodList
	if err := a.Pods.List(ctx, &list, client.InNamespace(namespace), client.MatchingFields{podNodeField: node}); err != nil {
		return nil, fmt.Errorf("listing the pods of %s on node %q: %w", namespace, node, err)
	}
	pods := make(map[string]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		pods[list.Items[i].Name] = &list.Items[i]
	}
	return pods, nil
}

// reread reads again, one GET each, the Pods of the endpoints that fail against the LIST (a Pod
// that moved, was recreated or changed since): the honest race is re-read, then decided, and
// the Event names what the Pod really is. Only the suspects cost a request.
func (a *Auditor) reread(ctx context.Context, in *Input, refs []string) error {
	for _, name := range suspects(Decide(*in), refs) {
		var pod corev1.Pod
		err := a.Pods.Get(ctx, client.ObjectKey{Namespace: in.Namespace, Name: name}, &pod)
		switch {
		case apierrors.IsNotFound(err):
			delete(in.Pods, name)
		case err != nil:
			return fmt.Errorf("reading pod %s/%s: %w", in.Namespace, name, err)
		default:
			in.Pods[name] = &pod
		}
	}
	return nil
}

// apply deletes the forged slice, then records the Event (on the slice's resource) and counts.
// A slice rewritten or deleted meanwhile is left to its next audit.
func (a *Auditor) apply(ctx context.Context, s *discoveryv1.EndpointSlice, node string, forged []Forged) error {
	deleted, err := a.Deleter.DeleteForged(ctx, s)
	if err != nil || !deleted {
		return err
	}
	parts := make([]string, 0, len(forged))
	for _, f := range forged {
		parts = append(parts, fmt.Sprintf("endpoint %s (pod %q): %s", f.Address, f.Pod, f.Reason))
	}
	var regarding runtime.Object = s
	if ref, ok := slicemeta.ResourceRef(s.OwnerReferences); ok {
		regarding = &v1alpha1.ServiceWithHealthchecks{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: ref.Name, UID: ref.UID}}
	}
	a.Recorder.Eventf(regarding, s, corev1.EventTypeWarning, EventForged, "DeleteForgedSlice",
		"Deleted EndpointSlice %s published for node %q: %s", s.Name, node, strings.Join(parts, "; "))
	ctrl.LoggerFrom(ctx).Info("deleted a forged EndpointSlice", "slice", s.Name, "node", node, "endpoints", parts)
	return nil
}
