// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/coalesce"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/credentials"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/publisher"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/scheduler"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/sliceplan"
)

// MaxRetryDelay bounds the backoff of a resource whose reconcile failed.
const MaxRetryDelay = 30 * time.Second

// ConflictRecheck is how soon a resource with a slice name held by someone else is reconciled
// again: the holder may go away without an event this agent sees (a slice of another manager is
// not in its cache).
const ConflictRecheck = time.Minute

// NodeRecheck is how soon a resource is reconciled again when this agent's Node was not in the
// cache (its appearance reconciles every resource at once too; this covers an event that raced
// with the reconcile).
const NodeRecheck = 10 * time.Second

// Event reasons.
const (
	ReasonPortReady      = "PortReady"
	ReasonPortNotReady   = "PortNotReady"
	ReasonSliceNameTaken = "EndpointSliceNameTaken"
	// ReasonPortsChanged is the summary of a resource's port transitions in one window.
	ReasonPortsChanged = "PortsChanged"
	// ReasonDrained and ReasonUndrained report a pod's port taken out of new connections by
	// its drain annotation, and published on its verdict again, on the resource and the pod.
	ReasonDrained   = "Drained"
	ReasonUndrained = "Undrained"
	// ReasonDrainInvalid reports, on a pod, a drain annotation or entries of it the agent
	// cannot apply (bad syntax, a resource or port that does not exist).
	ReasonDrainInvalid = "DrainInvalid"
)

// Scheme knows the built-in types and the module's.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// newReconciler returns a reconciler of node's resources with its memory between reconciles;
// the caller sets its Scheduler, Publisher, Recorder and Credentials (which call back into it).
func newReconciler(c client.Client, node string, m *metrics.Metrics, log logr.Logger, window time.Duration, burst int) *Reconciler {
	return &Reconciler{
		Client: c, Node: node, Metrics: m, Log: log, Window: window, Burst: burst,
		queue:     &workQueue{},
		coalescer: coalesce.New[types.NamespacedName](window, burst, nil),
		refs:      newSecretReferences(),
		gauges:    newEndpointGauges(m),
		nodeWait:  &nodeWait{},
		windows:   newEventWindows(EventWindow, nil),
		ownWrites: newOwnWrites(),
		budget:    newBudgetNotes(),
	}
}

// Reconciler reconciles one ServiceWithHealthchecks on this node, in four steps: observe (the
// caches and the scheduler's results), Decide (pure), apply (the scheduler's targets, the Secret
// watches, the publisher's writes) and record (Events and gauges from what was written).
type Reconciler struct {
	Client      client.Client
	Node        string
	Scheduler   *scheduler.Scheduler
	Publisher   *publisher.Publisher
	Recorder    events.EventRecorder
	Credentials *credentials.Store
	Metrics     *metrics.Metrics
	Log         logr.Logger
	// Window and Burst coalesce result changes (a budget of Burst reconciles per resource that
	// regains one every Window, see enqueueChange).
	Window time.Duration
	Burst  int
	// MaxEndpointsPerSlice is how many endpoints one slice holds before its group is split
	// into chunks (sliceplan.Input.MaxEndpointsPerSlice; 0 is the default).
	MaxEndpointsPerSlice int

	// podIndex is the pod informer's indexer: observe reads the cache's pods from it without
	// copying them.
	podIndex toolscache.Indexer

	// The memory between reconciles (state.go, eventwindow.go), made by newReconciler.
	queue     *workQueue
	coalescer *coalesce.Coalescer[types.NamespacedName]
	refs      *secretReferences
	gauges    *endpointGauges
	nodeWait  *nodeWait
	windows   *eventWindows
	ownWrites *ownWrites
	budget    *budgetNotes
}

// Reconcile observes, decides, applies and records for one resource on this node.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := r.Log.WithValues("swh", req.NamespacedName)
	o, err := r.observe(ctx, req.NamespacedName)
	switch {
	case errors.Is(err, errResourceGone):
		// The controller removes the slices of deleted resources; the agent only stops probing.
		r.forget(req.NamespacedName)
		return reconcile.Result{}, nil
	case errors.Is(err, errNodeUnknown):
		// Nothing is published before the node is read: zone hints would be wrong. The Node's
		// own event reconciles every resource once it appears.
		log.Info("not publishing: this agent's Node is not in the cache", "node", r.Node)
		r.nodeWait.missing()
		return reconcile.Result{RequeueAfter: NodeRecheck}, nil
	case err != nil:
		return reconcile.Result{}, err
	}

	d := r.decide(o)
	if !o.Resource.Status.ServiceOwned() {
		log.V(1).Info("withholding: the child Service is not this resource's own (yet)")
	}

	var written publisher.Result
	var writeErr error
	if d.Plan.HasChanges() || len(d.Plan.Conflicts) > 0 {
		log.V(1).Info("publishing", "create", len(d.Plan.Create), "update", len(d.Plan.Update),
			"delete", len(d.Plan.Delete), "conflicts", len(d.Plan.Conflicts))
		written, writeErr = r.Publisher.Apply(ctx, d.Plan)
		r.ownWrites.note(written.Written)
	}
	// The targets and the Secret watches after the write, not before: the write carries a
	// decided change and waits for nothing else (at 1,000 pods the scheduler's Set costs about
	// a millisecond); a target set changes nothing until its next probe anyway.
	if r.Scheduler.Set(req.NamespacedName, d.Targets) != d.Allowed {
		// Another resource's demand moved the shares since decide: decide again.
		r.budgetChanged(req.NamespacedName)
	}
	r.setSecretRefs(req.NamespacedName, d.SecretRefs)

	r.record(o, d, written)
	r.recordBudget(o, d)
	if writeErr != nil {
		return reconcile.Result{}, writeErr
	}
	if len(written.Conflicts) > 0 {
		return reconcile.Result{RequeueAfter: conflictRecheck(o.Resource, written.Conflicts)}, nil
	}
	return reconcile.Result{}, nil
}

// conflictRecheck is how soon a resource with a name held by someone else is reconciled again:
// ConflictRecheck, or the resource's probe period when a squatter holds a name
// (sliceplan.Conflict.Squatted): the controller deletes the squatter, and no event of that
// reaches this agent (its cache holds only its own node's slices), so it publishes within a
// probe period of the deletion. A squatted name costs a failed create and a read per period.
func conflictRecheck(swh *v1alpha1.ServiceWithHealthchecks, conflicts []sliceplan.Conflict) time.Duration {
	for _, c := range conflicts {
		if !c.Squatted {
			continue
		}
		period := time.Second
		if hc := swh.Spec.Healthcheck; hc != nil {
			period = time.Duration(max(hc.PeriodSeconds, 1)) * time.Second
		}
		return min(period, ConflictRecheck)
	}
	return ConflictRecheck
}

// forget drops everything the agent keeps for a resource.
func (r *Reconciler) forget(res types.NamespacedName) {
	r.Scheduler.Set(res, nil)
	r.coalescer.Forget(res)
	r.gauges.set(res, nil)
	r.windows.forget(res)
	r.budget.turnedOver(res, false)
	r.setSecretRefs(res, nil)
}

// setSecretRefs records the credential Secrets of a resource and hands the union of all
// resources' references to the credential store when it changed.
func (r *Reconciler) setSecretRefs(res types.NamespacedName, refs []types.NamespacedName) {
	all, changed := r.refs.set(res, refs)
	if changed && r.Credentials != nil {
		r.Credentials.SetReferences(all)
	}
}

// errResourceGone and errNodeUnknown end a reconcile early (observe).
var (
	errResourceGone = errors.New("the resource is gone or being deleted")
	errNodeUnknown  = errors.New("this agent's Node is not known")
)
