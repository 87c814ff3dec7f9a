// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sync/singleflight"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/index"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/slicewrite"
)

// podNodeField is the Pods' field selector by node, served by the API server.
const podNodeField = "spec.nodeName"

// OwnerRetry is how long the audit waits before it looks again at a slice whose owning
// resource its cache does not hold (yet).
const OwnerRetry = 5 * time.Second

// EventForged is the reason of the Event recorded when a forged slice is deleted.
const EventForged = "ForgedEndpointSlice"

// SliceDeleter deletes a slice only if it is still the object read: with
// slicewrite.SameVersion also at the resourceVersion read, with slicewrite.SameObject whatever
// changed in it since. A slice rewritten (SameVersion) or deleted since is not deleted blind
// (deleted false, err nil). The program's one slice writer (package slicewrite) is it, and
// counts the deletion: DeleteForged as a forgery, DeleteRedundant as a redundant slice
// (redundant.go).
type SliceDeleter interface {
	DeleteForged(ctx context.Context, s *discoveryv1.EndpointSlice, p slicewrite.Precondition) (deleted bool, err error)
	DeleteRedundant(ctx context.Context, s *discoveryv1.EndpointSlice, p slicewrite.Precondition) (deleted bool, err error)
}

// DefaultWorkers is how many slices the audit judges at once by default.
const DefaultWorkers = 4

// Auditor is the reconciler of this module's EndpointSlices.
type Auditor struct {
	// Client reads slices and resources from the manager's cache.
	Client client.Reader
	// API reads from the API server, uncached: one LIST of the slice's node's Pods per audit,
	// then a GET of each Pod whose endpoint fails against it (at most MaxRereads, the re-read
	// before deciding), and the latest version of a slice whose delete conflicted.
	API client.Reader
	// Deleter deletes forged slices.
	Deleter SliceDeleter
	// Recorder records the ForgedEndpointSlice Events.
	Recorder events.EventRecorder
	// Metrics counts audits and deletions.
	Metrics *metrics.Metrics
	// Now is the clock of the confirmation window.
	Now func() time.Time
	// Verified receives what each audit found real (for the status); nil: nothing is kept.
	Verified *Verified
	// StaleNode tells whether a node's agent is judged stale (its slices' endpoints that route
	// nothing may be the controller's withdrawal of Pods gone with the node: not audited); nil:
	// none is.
	StaleNode func(node string) bool

	// onAudit is Config.OnAudit.
	onAudit func(types.NamespacedName, string)

	confirm *confirmer
	// flight shares one LIST among the audits of a namespace and node running at once.
	flight singleflight.Group
	// clean holds the slices a sibling's audit found clean (batch.go).
	clean *cleanSet
	// redundant holds since when slices have repeated endpoints of their group (redundant.go).
	redundant *redundancy
}

// Config tunes the audit.
type Config struct {
	// Window is the confirmation window (0: DefaultWindow).
	Window time.Duration
	// Workers is how many slices are judged at once (0: DefaultWorkers).
	Workers int
	// Now is the clock (nil: time.Now; tests inject theirs).
	Now func() time.Time
	// SkipNameValidation lets one process run several managers (tests).
	SkipNameValidation bool
	// Deleter deletes forged slices: the program's slice writer.
	Deleter SliceDeleter
	// WrapReader, when set (tests), wraps the cache reader of slices and resources.
	WrapReader func(client.Reader) client.Reader
	// Verified receives the verified endpoints (nil: none kept).
	Verified *Verified
	// StaleNode is Auditor.StaleNode.
	StaleNode func(node string) bool
	// OnAudit, when set (tests), is called after each audit of a slice with its name and the
	// resourceVersion judged (by its own audit or, found clean, by a sibling's), once its group
	// is judged too (redundant.go) and before a forged slice is deleted.
	OnAudit func(name types.NamespacedName, resourceVersion string)
	// OnQueued, when set (tests), is called with each request the audit's queue takes in and
	// the node it is queued under (queue.go), under the queue's lock: it must not block.
	OnQueued func(req reconcile.Request, node string)
}

// Setup registers the audit with mgr: it judges a slice on its own events and on those of the
// Pods its endpoints name (a Pod deleted, relabelled or ended after its slice was judged).
func Setup(mgr ctrl.Manager, m *metrics.Metrics, recorder events.EventRecorder, cfg Config) error {
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	var cached client.Reader = mgr.GetClient()
	if cfg.WrapReader != nil {
		cached = cfg.WrapReader(cached)
	}
	a := &Auditor{
		Client: cached, API: mgr.GetAPIReader(), Deleter: cfg.Deleter, Verified: cfg.Verified, StaleNode: cfg.StaleNode,
		Recorder: recorder, Metrics: m, Now: cfg.Now, confirm: newConfirmer(cfg.Window), clean: newCleanSet(), onAudit: cfg.OnAudit,
		redundant: newRedundancy(cfg.Window),
	}
	a.confirm.onKnown = m.SetNodeForgeries
	err := ctrl.NewControllerManagedBy(mgr).
		Named("endpointsliceaudit").
		For(&discoveryv1.EndpointSlice{}).
		// Metadata only (the manager's cache keeps just each Pod's name, UID and version), not
		// the Pods themselves: every change of a Pod a slice names brings that slice back, and
		// its audit reads the Pod from the API server.
		WatchesMetadata(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(a.podToSlices),
			builder.WithPredicates(predicate.Funcs{CreateFunc: func(event.CreateEvent) bool { return false }})).
		// Fair between nodes (queue.go): one node's flood of slices does not hold the audit of the
		// others' behind it.
		WithOptions(controller.Options{SkipNameValidation: ptr.To(cfg.SkipNameValidation), MaxConcurrentReconciles: cfg.Workers,
			NewQueue: fairQueue(mgr.GetCache(), cfg.OnQueued)}).
		Complete(a)
	if err != nil {
		return fmt.Errorf("creating the EndpointSlice audit: %w", err)
	}
	return nil
}

// podToSlices maps a Pod (changed or deleted) to the slices of its namespace that name it
// (index.SlicePod), each to be judged again even if a sibling's audit found it clean.
func (a *Auditor) podToSlices(ctx context.Context, obj client.Object) []reconcile.Request {
	a.clean.podChanged(obj.GetNamespace())
	var list discoveryv1.EndpointSliceList
	if err := a.Client.List(ctx, &list, client.InNamespace(obj.GetNamespace()), client.MatchingFields{index.SlicePod: obj.GetName()},
		client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing the EndpointSlices that name a Pod", "namespace", obj.GetNamespace(), "pod", obj.GetName())
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		key := types.NamespacedName{Namespace: list.Items[i].Namespace, Name: list.Items[i].Name}
		a.clean.forget(key)
		out = append(out, reconcile.Request{NamespacedName: key})
	}
	return out
}

// Reconcile audits one slice: observe (slice and resource from the cache, the node's Pods in one
// LIST from the API server, the suspects' Pods again one by one), decide, and once a mismatch
// has lasted the window (or repeats a forgery confirmed for the node), apply.
func (a *Auditor) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var s discoveryv1.EndpointSlice
	if err := a.Client.Get(ctx, req.NamespacedName, &s); err != nil {
		if apierrors.IsNotFound(err) {
			a.confirm.forgetSlice(req.NamespacedName)
			a.clean.forget(req.NamespacedName)
			a.Verified.forget(req.NamespacedName)
			a.redundant.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if !slicemeta.IsManaged(&s) || s.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	if a.clean.take(req.NamespacedName, version{uid: s.UID, rv: s.ResourceVersion}) {
		// Audited clean at this version with a sibling (batch.go); whether it repeats endpoints
		// of its group is the group's, judged now.
		wait, err := a.judgeGroup(ctx, &s)
		if err != nil {
			return ctrl.Result{}, err
		}
		if a.onAudit != nil {
			a.onAudit(req.NamespacedName, s.ResourceVersion)
		}
		return ctrl.Result{RequeueAfter: wait}, nil
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
	forged := Decide(in)
	a.Verified.record(&s, in, len(forged) == 0)
	v := a.confirm.observe(req.NamespacedName, s.UID, in.Node, in.Namespace, forged, cleanKeys(in, forged), a.Now())
	wait := v.wait
	if len(forged) == 0 {
		// A clean slice may still repeat endpoints of its group (redundant.go); a forged one is
		// the forgery's to remove.
		if wait, err = a.judgeGroup(ctx, &s); err != nil {
			return ctrl.Result{}, err
		}
	}
	if a.onAudit != nil {
		a.onAudit(req.NamespacedName, s.ResourceVersion)
	}
	if len(v.confirmed) == 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	return ctrl.Result{}, a.apply(ctx, &s, in, v)
}

// cleanKeys are the fullKeys of the endpoints of in that are not among forged.
func cleanKeys(in Input, forged []Forged) []string {
	bad := make(map[string]bool, len(forged))
	for _, f := range forged {
		bad[fullKey(in.Namespace, f)] = true
	}
	var out []string
	for i := range in.Endpoints {
		e := &in.Endpoints[i]
		if e.TargetRef == nil || len(e.Addresses) == 0 {
			continue
		}
		k := fullKey(in.Namespace, Forged{Address: e.Addresses[0], Pod: e.TargetRef.Name, UID: string(e.TargetRef.UID)})
		if !bad[k] {
			out = append(out, k)
		}
	}
	return out
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
	in := a.input(s, &swh, nil)
	refs := PodRefs(s.Namespace, s.Endpoints, in.WholeSlice)
	if len(refs) == 0 {
		in.Pods = map[string]*corev1.Pod{}
		return in, true, nil
	}
	// The same LIST audits the other slices of this namespace and node (batch.go).
	if in.Pods, err = a.nodePods(ctx, s, in.Node); err != nil {
		return Input{}, false, err
	}
	if err := a.reread(ctx, &in, refs); err != nil {
		return Input{}, false, err
	}
	return in, true, nil
}

// input is what Decide judges of slice s of resource swh against pods.
func (a *Auditor) input(s *discoveryv1.EndpointSlice, swh *v1alpha1.ServiceWithHealthchecks, pods map[string]*corev1.Pod) Input {
	node := slicemeta.NodeOf(s)
	in := Input{Namespace: s.Namespace, Node: node, Selector: swh.Spec.Selector, Endpoints: s.Endpoints, Pods: pods, Ports: s.Ports,
		WholeSlice: a.StaleNode == nil || !a.StaleNode(node)}
	if port, ok := slicemeta.PortOf(s); ok {
		for i := range swh.Spec.Ports {
			if swh.Spec.Ports[i].Name == port {
				in.ServicePort = &swh.Spec.Ports[i]
				break
			}
		}
	}
	return in
}

// podsOnNode reads, in one uncached LIST, the Pods of the namespace bound to the slice's node:
// an honest slice names only those, so one request serves all its endpoints however many.
func (a *Auditor) podsOnNode(ctx context.Context, namespace, node string) (map[string]*corev1.Pod, error) {
	var list corev1.PodList
	if err := a.API.List(ctx, &list, client.InNamespace(namespace), client.MatchingFields{podNodeField: node}); err != nil {
		return nil, fmt.Errorf("listing the pods of %s on node %q: %w", namespace, node, err)
	}
	pods := make(map[string]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		pods[list.Items[i].Name] = &list.Items[i]
	}
	return pods, nil
}

// reread reads again, one GET each, the Pods of the endpoints that fail against the LIST (a Pod
// that moved, was recreated or changed since), at most MaxRereads: the honest race is re-read,
// then decided, and the Event names what the Pod really is. Only the suspects cost a request.
func (a *Auditor) reread(ctx context.Context, in *Input, refs []string) error {
	for _, name := range suspects(Decide(*in), refs) {
		var pod corev1.Pod
		err := a.API.Get(ctx, client.ObjectKey{Namespace: in.Namespace, Name: name}, &pod)
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
