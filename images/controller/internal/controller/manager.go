// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/audit"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/childservice"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/index"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/liveness"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/slicewrite"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/status"
	"github.com/deckhouse/service-with-healthchecks/lib/eventnote"
)

// Names the controller is known by.
const (
	// LeaderElectionID names the leader election Lease.
	LeaderElectionID = "service-with-healthchecks-controller"
	// EventSource is the reporting controller of the Events it records.
	EventSource = "service-with-healthchecks-controller"
	// controllerName names the reconciler in logs and controller-runtime's metrics.
	controllerName = "servicewithhealthchecks"
	// DefaultMaxConcurrentReconciles is how many resources are reconciled at once by default.
	DefaultMaxConcurrentReconciles = 1
)

// Options configure the manager and the reconciler.
type Options struct {
	// MetricsBindAddress serves metrics ("0": none).
	MetricsBindAddress string
	// HealthProbeBindAddress serves /healthz and /readyz ("0": none).
	HealthProbeBindAddress string
	// LeaderElect turns leader election on; LeaderElectionNamespace holds its Lease.
	LeaderElect             bool
	LeaderElectionNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod tune leader election (0: 15s, 10s, 2s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// KeepLeaseOnStop leaves the Lease to expire instead of releasing it on stop, like a crashed
	// leader (tests).
	KeepLeaseOnStop bool
	// AgentLeaseNamespace and AgentLostGrace are for the withdrawal of endpoints of lost agents.
	AgentLeaseNamespace string
	AgentLostGrace      time.Duration
	// FieldManager names the controller in managedFields (default childservice.FieldManager).
	// Every replica must use the same one; tests give each manager its own to see who writes.
	FieldManager string
	// Namespaces restricts the namespaced informers (tests); empty means all namespaces.
	Namespaces []string
	// Registry receives the controller's metrics (default controller-runtime's registry).
	Registry prometheus.Registerer
	// SkipNameValidation lets one process run several managers (tests).
	SkipNameValidation bool
	// Logger is the base logger.
	Logger logr.Logger
	// MaxConcurrentReconciles is how many resources are reconciled at once (0:
	// DefaultMaxConcurrentReconciles). One resource is never reconciled by two workers at once
	// (controller-runtime's queue); different resources share only the informer caches, the
	// metrics and the record of swept Services, all safe for concurrent use.
	MaxConcurrentReconciles int
	// SkipAudit turns off the audit of published endpoints (tests whose slices name no Pods);
	// AuditWindow is its confirmation window (0: audit.DefaultWindow).
	SkipAudit   bool
	AuditWindow time.Duration
	// AuditWorkers is how many slices the audit judges at once (0: audit.DefaultWorkers).
	AuditWorkers int

	// onReconcile, when set (tests), is called as a reconcile starts; the function it returns
	// is called as it ends.
	onReconcile func() func()
	// auditNow, when set (tests), is the clock of the audit's confirmation window.
	auditNow func() time.Time
	// onAudit, when set (tests), is called after each audit with the slice and the version
	// judged.
	onAudit func(types.NamespacedName, string)
	// auditReader, when set (tests), wraps the cache reader the audit reads slices and resources
	// with: a test makes the cache lag behind the API server with it.
	auditReader func(client.Reader) client.Reader
	// onAuditQueued, when set (tests), is called with each request the audit's queue takes in
	// and the node it is queued under (audit.Config.OnQueued).
	onAuditQueued func(reconcile.Request, string)
}

// NewManager creates a manager that runs the reconciler while it leads. It serves health on
// HealthProbeBindAddress and metrics on MetricsBindAddress.
func NewManager(cfg *rest.Config, o Options) (ctrl.Manager, *metrics.Metrics, error) {
	scheme := newScheme()
	cacheOpts := cache.Options{
		Scheme: scheme,
		// The cache keeps no managedFields (development/CONTROLLER.md, "Memory"): nothing reads
		// them but the Service reconcile, and every cached slice and resource carries them.
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			// Only this module's slices: other controllers' slices are never ours to touch,
			// and there are many of them.
			&discoveryv1.EndpointSlice{}: {Label: labels.SelectorFromSet(labels.Set{discoveryv1.LabelManagedBy: wellknown.ManagedBy})},
			// Services keep theirs: upgradeManagedFields turns the controller's create into its
			// apply ownership from the cached Service's managedFields.
			&corev1.Service{}: {Transform: keepObject},
			// The audit watches Pods metadata only, for their changes (it reads Pods from the API
			// server): of each, the cache keeps only its name, namespace, UID and version.
			&corev1.Pod{}: {Transform: podIdentity},
		},
	}
	if len(o.Namespaces) > 0 {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range o.Namespaces {
			cacheOpts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	mo := ctrl.Options{
		Scheme:                        scheme,
		Logger:                        o.Logger,
		Cache:                         cacheOpts,
		Metrics:                       metricsserver.Options{BindAddress: o.MetricsBindAddress},
		HealthProbeBindAddress:        o.HealthProbeBindAddress,
		LeaderElection:                o.LeaderElect,
		LeaderElectionID:              LeaderElectionID,
		LeaderElectionNamespace:       o.LeaderElectionNamespace,
		LeaderElectionResourceLock:    "leases",
		LeaderElectionReleaseOnCancel: !o.KeepLeaseOnStop,
		Controller:                    ctrlconfig.Controller{SkipNameValidation: ptr.To(o.SkipNameValidation)},
	}
	if o.LeaseDuration > 0 {
		mo.LeaseDuration, mo.RenewDeadline, mo.RetryPeriod = &o.LeaseDuration, &o.RenewDeadline, &o.RetryPeriod
	}
	mgr, err := ctrl.NewManager(cfg, mo)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the manager: %w", err)
	}
	// The reconciler and the liveness runner read slices through these indexes.
	if err := index.Register(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return nil, nil, err
	}
	reg := o.Registry
	if reg == nil {
		reg = ctrlmetrics.Registry
	}
	m, err := metrics.New(reg)
	if err != nil {
		return nil, nil, err
	}
	// The program's one EndpointSlice writer: garbage, built-in slices and withdrawals.
	writer := slicewrite.New(mgr.GetClient(), m, m.Liveness)
	var agents *liveness.Agents
	if o.AgentLeaseNamespace != "" {
		// Liveness of the agents (development/LIVENESS.md): leader-only, withdraws stale nodes'
		// endpoints and publishes its verdicts for the AgentsStale condition.
		agents, err = liveness.Setup(mgr, liveness.Options{Namespace: o.AgentLeaseNamespace, Grace: o.AgentLostGrace, Writer: writer, Metrics: m.Liveness})
		if err != nil {
			return nil, nil, err
		}
	}
	// What the audit found real: the status counts only that (nil: the audit is off).
	var verified *audit.Verified
	if !o.SkipAudit {
		verified = audit.NewVerified()
	}
	if err := setup(mgr, m, writer, o, agents, verified); err != nil {
		return nil, nil, err
	}
	// The audit of published endpoints (development/CONTROLLER.md): deletes forged slices
	// through the one writer.
	if err := setupAudit(mgr, m, writer, o, agents, verified); err != nil {
		return nil, nil, err
	}
	if err := addHealthChecks(mgr); err != nil {
		return nil, nil, err
	}
	return mgr, m, nil
}

// podIdentity is the cache transform of the audit's metadata-only Pods: the name, namespace,
// UID, version and deletion time, nothing else (no labels, annotations or owners: at tens of
// thousands of Pods in a cluster their metadata would be most of the cache).
func podIdentity(in any) (any, error) {
	m, ok := in.(*metav1.PartialObjectMetadata)
	if !ok {
		return in, nil
	}
	return &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion, DeletionTimestamp: m.DeletionTimestamp,
	}}, nil
}

// keepObject is the cache transform that keeps an object as the API server sent it.
func keepObject(in any) (any, error) { return in, nil }

// addHealthChecks serves /healthz (the process answers) and /readyz (the informers synced).
func addHealthChecks(mgr ctrl.Manager) error {
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding the health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("informers", func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("informer caches have not synced yet")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("adding the readiness check: %w", err)
	}
	return nil
}

// setupAudit registers the audit of published endpoints unless o.SkipAudit; agents (nil when
// not judged) tells it which nodes' agents are stale.
func setupAudit(mgr ctrl.Manager, m *metrics.Metrics, writer *slicewrite.Writer, o Options, agents *liveness.Agents, verified *audit.Verified) error {
	if o.SkipAudit {
		return nil
	}
	var stale func(string) bool
	if agents != nil {
		stale = func(node string) bool { return slices.Contains(agents.Current().Stale, node) }
	}
	return audit.Setup(mgr, m, eventnote.Capped(mgr.GetEventRecorder(EventSource)), audit.Config{
		Window: o.AuditWindow, Workers: o.AuditWorkers, Now: o.auditNow, WrapReader: o.auditReader,
		SkipNameValidation: o.SkipNameValidation, Deleter: writer, Verified: verified, StaleNode: stale, OnAudit: o.onAudit,
		OnQueued: o.onAuditQueued,
	})
}

// newScheme knows the built-in types and the module's.
func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	return s
}

// agentsStatus is the judgement for the status; nil when agents are not judged.
func agentsStatus(a *liveness.Agents) *status.Agents {
	if a == nil {
		return nil
	}
	j := a.Current()
	return &status.Agents{Known: j.Known, Stale: j.Stale, Guarded: j.Guarded, LookStale: j.LookStale, LeaseNamespace: a.Namespace}
}

// overBudget are the agents' reports of the resource over their probe budget, from the nodes
// where the resource has pods (status.FromNodesWithPods over owned, the slices as the audit
// verified them); none when agents are not judged.
func overBudget(a *liveness.Agents, key client.ObjectKey, owned []discoveryv1.EndpointSlice) []status.NodeBudget {
	if a == nil {
		return nil
	}
	var out []status.NodeBudget
	for _, nb := range a.OverBudget(key) {
		out = append(out, status.NodeBudget{Node: nb.Node, Budget: nb.Budget, Asked: nb.Asked, Allowed: nb.Allowed})
	}
	return status.FromNodesWithPods(out, owned)
}

// setup registers the reconciler and its watches with mgr; agents is nil when the agents'
// liveness is not judged.
func setup(mgr ctrl.Manager, m *metrics.Metrics, writer *slicewrite.Writer, o Options, agents *liveness.Agents, verified *audit.Verified) error {
	cs, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return fmt.Errorf("creating the clientset: %w", err)
	}
	fm := o.FieldManager
	if fm == "" {
		fm = childservice.FieldManager
	}
	r := &Reconciler{
		client:       mgr.GetClient(),
		reader:       mgr.GetAPIReader(),
		services:     cs,
		sliceWriter:  writer,
		recorder:     eventnote.Capped(mgr.GetEventRecorder(EventSource)),
		metrics:      m,
		fieldManager: fm,
		agents:       agents,
		verified:     verified,
		now:          time.Now,
		onReconcile:  o.onReconcile,
	}
	workers := o.MaxConcurrentReconciles
	if workers <= 0 {
		workers = DefaultMaxConcurrentReconciles
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named(controllerName).
		For(&v1alpha1.ServiceWithHealthchecks{}).
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(r.serviceToResource)).
		// A resource created, deleted or with changed ports may start or end a slice name
		// conflict with others of its namespace (status updates change no generation).
		Watches(&v1alpha1.ServiceWithHealthchecks{}, handler.EnqueueRequestsFromMapFunc(r.collidingResources),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(sliceToResource)).
		WatchesMetadata(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.nodeToResources),
			builder.WithPredicates(predicate.Funcs{
				CreateFunc:  func(event.CreateEvent) bool { return false },
				UpdateFunc:  func(event.UpdateEvent) bool { return false },
				DeleteFunc:  func(event.DeleteEvent) bool { return true },
				GenericFunc: func(event.GenericEvent) bool { return false },
			})).
		WithOptions(controller.Options{SkipNameValidation: ptr.To(o.SkipNameValidation), MaxConcurrentReconciles: workers})
	if agents != nil {
		// An agent turning stale or fresh, or the guard turning on or off, changes the
		// AgentsStale condition of the resources with slices on the nodes concerned.
		b = b.WatchesRawSource(source.Channel(agents.Changes(), handler.EnqueueRequestsFromMapFunc(r.nodeToResources)))
		// An agent's probe-budget report on a resource changed: its ProbeBudgetExceeded.
		b = b.WatchesRawSource(source.Channel(agents.BudgetChanges(), &handler.EnqueueRequestForObject{}))
	}
	if err := b.Complete(r); err != nil {
		return fmt.Errorf("creating the controller: %w", err)
	}
	return nil
}

// serviceToResource maps a Service to the resource of the same name, when there is one or when
// the Service is controlled by one (to delete it once that resource is gone).
func (r *Reconciler) serviceToResource(ctx context.Context, obj client.Object) []reconcile.Request {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return nil
	}
	key := client.ObjectKeyFromObject(svc)
	if !childservice.ControlledByResource(svc, svc.Name) {
		if err := r.client.Get(ctx, key, &v1alpha1.ServiceWithHealthchecks{}); err != nil {
			return nil
		}
	}
	return []reconcile.Request{{NamespacedName: key}}
}

// collidingResources maps a resource to the other live resources of its namespace whose slice
// names collide with its own (before and after a change: the handler maps both objects of an
// update), so that their SliceNameConflict condition follows. Only the resources named by
// status.CollisionCandidates can collide; they are read from the cache by name.
func (r *Reconciler) collidingResources(ctx context.Context, obj client.Object) []reconcile.Request {
	swh, ok := obj.(*v1alpha1.ServiceWithHealthchecks)
	if !ok {
		return nil
	}
	candidates, err := r.collisionCandidates(ctx, swh)
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "reading the resources whose slice names may collide", "namespace", swh.Namespace, "name", swh.Name)
		return nil
	}
	// A deleted resource no longer collides, but the ones it collided with must hear of it.
	was := *swh
	was.DeletionTimestamp = nil
	var out []reconcile.Request
	for i := range candidates {
		other := &candidates[i]
		if len(status.Collisions(other, []v1alpha1.ServiceWithHealthchecks{was})) > 0 {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(other)})
		}
	}
	return out
}

// collisionCandidates reads from the cache the resources of swh's namespace named by
// status.CollisionCandidates (those that exist): the only ones whose slice names can collide
// with swh's on every node.
func (r *Reconciler) collisionCandidates(ctx context.Context, swh *v1alpha1.ServiceWithHealthchecks) ([]v1alpha1.ServiceWithHealthchecks, error) {
	var out []v1alpha1.ServiceWithHealthchecks
	for _, name := range status.CollisionCandidates(swh) {
		var other v1alpha1.ServiceWithHealthchecks
		err := r.client.Get(ctx, client.ObjectKey{Namespace: swh.Namespace, Name: name}, &other)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, fmt.Errorf("reading ServiceWithHealthchecks %s/%s: %w", swh.Namespace, name, err)
		default:
			out = append(out, other)
		}
	}
	return out, nil
}

// sliceToResource maps one of this module's slices to the resource it was published for.
func sliceToResource(_ context.Context, obj client.Object) []reconcile.Request {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok || !slicemeta.IsManaged(s) {
		return nil
	}
	name := slicemeta.ResourceOf(s)
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: s.Namespace, Name: name}}}
}

// nodeToResources maps a node (deleted, or whose agent's judgement changed) to every resource
// with a slice on it. The slices are the cache's own objects (no copy): only read here.
func (r *Reconciler) nodeToResources(ctx context.Context, obj client.Object) []reconcile.Request {
	var list discoveryv1.EndpointSliceList
	if err := r.client.List(ctx, &list, client.MatchingFields{index.SliceNode: obj.GetName()}, client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing the EndpointSlices of a deleted node", "node", obj.GetName())
		return nil
	}
	seen := map[client.ObjectKey]bool{}
	var out []reconcile.Request
	for i := range list.Items {
		name := slicemeta.ResourceOf(&list.Items[i])
		key := client.ObjectKey{Namespace: list.Items[i].Namespace, Name: name}
		if name == "" || seen[key] {
			continue
		}
		seen[key] = true
		out = append(out, reconcile.Request{NamespacedName: key})
	}
	return out
}
