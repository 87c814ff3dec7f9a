// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package controller holds the reconciler of ServiceWithHealthchecks: it keeps the child Service,
// collects garbage EndpointSlices and writes the status. It observes, asks the pure deciders in
// childservice, gc and status what to do, and only then writes.
package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/csaupgrade"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/audit"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/childservice"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/liveness"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/slicewrite"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/status"
)

// conflictRetry is how soon a reconcile that lost a write race runs again.
const conflictRetry = 250 * time.Millisecond

// Event reasons besides the ServiceSynced reasons (which are also used as Event reasons).
const (
	eventServiceCreated  = "ServiceCreated"
	eventAdopted         = "Adopted"
	eventSelectorCleared = "SelectorCleared"
)

// Reconciler reconciles one ServiceWithHealthchecks per call; several calls for different
// resources may run at once (Options.MaxConcurrentReconciles), never two for the same one.
type Reconciler struct {
	// client reads from the informer cache and writes the status.
	client client.Client
	// reader reads from the API server itself: to confirm before deleting, and to look for pods.
	reader client.Reader
	// services writes child Services (typed results of create, apply and patch).
	services kubernetes.Interface
	// sliceWriter is the program's one EndpointSlice writer (garbage, built-in slices; the
	// liveness runner withdraws through the same one).
	sliceWriter *slicewrite.Writer
	recorder    events.EventRecorder
	metrics     *metrics.Metrics
	// fieldManager names the controller in managedFields.
	fieldManager string
	// agents is the liveness runner's judgement (nil when agents are not judged).
	agents *liveness.Agents
	// verified are the endpoints the audit found real (nil when the audit is off: all count).
	verified *audit.Verified
	// auditWait holds, per resource, since when a reconcile found a slice version the audit has
	// not judged yet (waitedForAudit).
	auditWait sync.Map
	now       func() time.Time
	// builtinSwept holds the UIDs of adopted Services whose built-in EndpointSlices this process
	// has already looked for and deleted (needsBuiltinSweep).
	builtinSwept sync.Map
	// onReconcile is Options.onReconcile (tests).
	onReconcile func() func()
}

// Reconcile brings the Service, the slices and the status of one resource in line.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, err error) {
	if r.onReconcile != nil {
		defer r.onReconcile()()
	}
	start := time.Now()
	defer func() {
		r.metrics.ReconcileDuration.Observe(time.Since(start).Seconds())
		switch {
		case err != nil:
			r.metrics.Reconciles.WithLabelValues(metrics.ResultError).Inc()
		case res.RequeueAfter > 0:
			r.metrics.Reconciles.WithLabelValues(metrics.ResultRequeue).Inc()
		default:
			r.metrics.Reconciles.WithLabelValues(metrics.ResultSuccess).Inc()
		}
	}()

	var swh v1alpha1.ServiceWithHealthchecks
	if err := r.client.Get(ctx, req.NamespacedName, &swh); err != nil {
		if !apierrors.IsNotFound(err) {
			r.metrics.Errors.WithLabelValues(metrics.OpRead).Inc()
			return ctrl.Result{}, fmt.Errorf("reading ServiceWithHealthchecks %s: %w", req, err)
		}
		r.metrics.ForgetResource(req.NamespacedName)
		r.auditWait.Delete(req.NamespacedName)
		return r.collectOrphans(ctx, req.NamespacedName)
	}
	if swh.DeletionTimestamp != nil {
		// Being deleted: what it owns goes with it (or with collectOrphans once it is gone).
		r.metrics.ForgetResource(req.NamespacedName)
		r.auditWait.Delete(req.NamespacedName)
		return ctrl.Result{}, nil
	}

	sliceList, err := r.listSlices(ctx, req.Namespace, req.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	live, err := r.getService(ctx, req.NamespacedName)
	if err != nil {
		return ctrl.Result{}, err
	}

	// The per-port counts are computed once, for the status. The adoption waits until every
	// port has a ready endpoint in every family of the Service (WithoutReadyIn).
	// Only what the audit found to be real pods of a slice's node counts (a slice version it
	// has not judged yet: look again shortly).
	owned, unverified := r.verified.Filter(status.Owned(&swh, sliceList), r.waitedForAudit(req.NamespacedName, true))
	waiting := unverified && !r.waitedForAudit(req.NamespacedName, false)
	if !unverified {
		r.auditWait.Delete(req.NamespacedName)
	}
	if waiting {
		// The status waits (at most verifyGrace) for the audit rather than counting without
		// the endpoints it has not judged yet and counting them again a moment later.
		res.RequeueAfter = verifyRetry
	}
	ports := status.Ports(&swh, owned)
	out, svcErr := r.syncService(ctx, &swh, live, status.WithoutReadyIn(&swh, owned, status.ServiceFamilies(live)))
	gcErr := r.collectSlices(ctx, &swh, sliceList)
	var stErr error
	if !conflict(svcErr) && !out.requeue && !waiting {
		// After a lost race the outcome says nothing about the Service: report on the next run.
		stErr = r.writeStatus(ctx, &swh, out, owned, ports)
	}

	if conflict(svcErr) || conflict(stErr) || out.requeue {
		r.metrics.Conflicts.WithLabelValues(metrics.ConflictWrite).Inc()
		ctrl.LoggerFrom(ctx).V(1).Info("lost a write race; reconciling again", "service", svcErr, "status", stErr)
		svcErr, stErr = ignoreConflict(svcErr), ignoreConflict(stErr)
		res.RequeueAfter = conflictRetry
	}
	if err := errors.Join(svcErr, gcErr, stErr); err != nil {
		return ctrl.Result{}, err
	}
	return res, nil
}

// serviceOutcome is what the Service sync leaves for the status.
type serviceOutcome struct {
	// synced is the ServiceSynced condition.
	synced metav1.Condition
	// service is the child Service when this resource owns it (after the writes), else nil.
	service *corev1.Service
	// requeue is set when the sync should run again soon (the cache lags behind a write).
	requeue bool
}

// syncService observes, decides and writes the Service of one resource. A Service this
// resource owns stays its Service in the outcome whatever write fails: status.clusterIP is
// cleared only when the controller has seen the Service absent, foreign or stale, never
// because a write failed (a 500, a timeout, an admission refusal); ServiceSynced carries the
// error. The agents read an empty status.clusterIP as "not ours" and withdraw every endpoint.
func (r *Reconciler) syncService(ctx context.Context, swh *v1alpha1.ServiceWithHealthchecks, live *corev1.Service, waiting []string) (serviceOutcome, error) {
	var out serviceOutcome
	if childservice.Classify(swh, live) == childservice.Owned {
		out.service = live
	}
	plan, err := r.planService(ctx, swh, live, waiting)
	if err != nil {
		out.synced = writeFailed(err)
		return out, err
	}
	out.synced = plan.Synced
	live, done, err := r.writePlanned(ctx, swh, live, plan, &out)
	if done || err != nil {
		return out, err
	}
	return out, r.finishService(ctx, swh, live, plan, &out)
}

// planService reads what the controller owns in live and, during an adoption, whether its
// selector selects pods, and asks childservice.Decide.
func (r *Reconciler) planService(ctx context.Context, swh *v1alpha1.ServiceWithHealthchecks, live *corev1.Service, waiting []string) (childservice.Plan, error) {
	var owned *corev1ac.ServiceApplyConfiguration
	if live != nil {
		var err error
		if owned, err = corev1ac.ExtractService(live, r.fieldManager); err != nil {
			return childservice.Plan{}, fmt.Errorf("reading the fields owned in Service %s/%s: %w", live.Namespace, live.Name, err)
		}
	}
	selectsPods := false
	if childservice.NeedsPodCheck(swh, live, waiting) {
		var err error
		if selectsPods, err = r.selectsPods(ctx, live); err != nil {
			return childservice.Plan{}, err
		}
	}
	plan := childservice.Decide(childservice.Input{
		Resource: swh, Live: live, Owned: owned, PortsWithoutReady: waiting, SelectsPods: selectsPods,
	})
	ctrl.LoggerFrom(ctx).V(1).Info("planned the child Service", "ownership", plan.Ownership.String(),
		"create", plan.Create != nil, "apply", plan.Apply != nil, "clearSelector", plan.ClearSelector,
		"deleteStale", plan.DeleteStale, "reason", plan.Synced.Reason)
	return plan, nil
}

// writePlanned deletes, creates or applies the Service as planned and returns the Service as
// written; done is set when nothing follows (a foreign or stale Service, a create the cache
// has not seen, a failed write). out.service is the written Service once it is this resource's.
func (r *Reconciler) writePlanned(ctx context.Context, swh *v1alpha1.ServiceWithHealthchecks, live *corev1.Service, plan childservice.Plan, out *serviceOutcome) (*corev1.Service, bool, error) {
	log := ctrl.LoggerFrom(ctx)
	switch {
	case plan.Ownership == childservice.Foreign:
		r.metrics.Conflicts.WithLabelValues(metrics.ConflictForeignService).Inc()
		return live, true, nil
	case plan.DeleteStale:
		err := r.services.CoreV1().Services(live.Namespace).Delete(ctx, live.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &live.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			r.metrics.Errors.WithLabelValues(metrics.OpDeleteService).Inc()
			return live, true, fmt.Errorf("deleting Service %s/%s left by a deleted resource: %w", live.Namespace, live.Name, err)
		}
		r.metrics.ServiceWrites.WithLabelValues(metrics.OpDeleteService).Inc()
		log.Info("deleted a Service left by a deleted resource of the same name", "service", client.ObjectKeyFromObject(live))
		return live, true, nil
	case plan.Create != nil:
		created, err := r.createService(ctx, plan.Create)
		if apierrors.IsAlreadyExists(err) {
			// The cache has not seen a Service that exists: look again once it has.
			out.requeue = true
			return live, true, nil
		}
		if err != nil {
			out.synced = r.writeCondition(err)
			return live, true, err
		}
		r.recorder.Eventf(swh, nil, corev1.EventTypeNormal, eventServiceCreated, "Create", "Created Service %s", created.Name)
		out.service = created
		return created, false, nil
	case plan.Apply != nil:
		applied, err := r.applyService(ctx, live, plan.Apply, plan.Adopt)
		if err != nil {
			// An owned Service stays out.service, as it was; an adoptable one is not ours yet.
			out.synced = r.writeCondition(err)
			if apierrors.IsInvalid(err) {
				// Retrying cannot help until the resource changes, which triggers a reconcile.
				return live, true, nil
			}
			return live, true, err
		}
		if plan.Adopt {
			r.metrics.Adoptions.Inc()
			r.recorder.Eventf(swh, nil, corev1.EventTypeNormal, eventAdopted, "Adopt",
				"Adopted Service %s; its cluster IP %s and node ports are kept", live.Name, live.Spec.ClusterIP)
			log.Info("adopted an existing Service", "service", client.ObjectKeyFromObject(live))
		}
		out.service = applied
		return applied, false, nil
	}
	return live, false, nil
}

// finishService upgrades the managedFields, clears the selector when planned and deletes the
// built-in slices of an adopted Service. live is this resource's Service: out.service is set
// to it before any write, and follows each write that succeeds; a failed Service write sets
// ServiceSynced to its error (a lost race is not reported: the reconcile runs again).
func (r *Reconciler) finishService(ctx context.Context, swh *v1alpha1.ServiceWithHealthchecks, live *corev1.Service, plan childservice.Plan, out *serviceOutcome) error {
	out.service = live
	if err := r.upgradeManagedFields(ctx, live); err != nil {
		out.synced = r.writeCondition(err)
		return err
	}
	if plan.ClearSelector {
		cleared, err := r.clearSelector(ctx, live)
		if err != nil {
			out.synced = r.writeCondition(err)
			return err
		}
		r.recorder.Eventf(swh, nil, corev1.EventTypeNormal, eventSelectorCleared, "ClearSelector",
			"Cleared the selector of Service %s: its endpoints now come from this module's EndpointSlices", live.Name)
		live = cleared
		out.service = live
	}
	if r.needsBuiltinSweep(live, plan.ClearSelector) {
		return r.deleteBuiltinSlices(ctx, swh, live)
	}
	return nil
}

// createService creates the Service. A create (not an apply) can never modify a Service that
// appeared since the cache was read.
func (r *Reconciler) createService(ctx context.Context, desired *corev1ac.ServiceApplyConfiguration) (*corev1.Service, error) {
	raw, err := json.Marshal(desired)
	if err != nil {
		return nil, fmt.Errorf("encoding the desired Service: %w", err)
	}
	var svc corev1.Service
	if err := json.Unmarshal(raw, &svc); err != nil {
		return nil, fmt.Errorf("decoding the desired Service: %w", err)
	}
	created, err := r.services.CoreV1().Services(svc.Namespace).Create(ctx, &svc, metav1.CreateOptions{FieldManager: r.fieldManager})
	if err != nil {
		if !apierrors.IsAlreadyExists(err) {
			r.metrics.Errors.WithLabelValues(metrics.OpCreate).Inc()
		}
		return nil, fmt.Errorf("creating Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	r.metrics.ServiceWrites.WithLabelValues(metrics.OpCreate).Inc()
	ctrl.LoggerFrom(ctx).Info("created the child Service", "service", client.ObjectKeyFromObject(created), "clusterIP", created.Spec.ClusterIP)
	return created, nil
}

// applyService applies desired to the Service live with server-side apply. The UID makes the
// write fail instead of touching a Service that replaced live meanwhile. An adoption also
// carries the resourceVersion: consent (the adopt annotation) withdrawn since live was read
// makes it fail with a conflict, and the next reconcile sees a foreign Service.
func (r *Reconciler) applyService(ctx context.Context, live *corev1.Service, desired *corev1ac.ServiceApplyConfiguration, adopt bool) (*corev1.Service, error) {
	cfg := *desired
	objectMeta := *desired.ObjectMetaApplyConfiguration
	objectMeta.UID = &live.UID
	if adopt {
		objectMeta.ResourceVersion = &live.ResourceVersion
	}
	cfg.ObjectMetaApplyConfiguration = &objectMeta
	applied, err := r.services.CoreV1().Services(live.Namespace).Apply(ctx, &cfg, metav1.ApplyOptions{FieldManager: r.fieldManager, Force: true})
	if err != nil {
		if !conflict(err) {
			r.metrics.Errors.WithLabelValues(metrics.OpApply).Inc()
		}
		return nil, fmt.Errorf("applying Service %s/%s: %w", live.Namespace, live.Name, err)
	}
	r.metrics.ServiceWrites.WithLabelValues(metrics.OpApply).Inc()
	ctrl.LoggerFrom(ctx).Info("updated the child Service", "service", client.ObjectKeyFromObject(live))
	return applied, nil
}

// upgradeManagedFields turns what the controller's create recorded as an update into the
// controller's apply ownership, so that later applies can remove what they no longer set.
// Nothing is written when there is nothing to turn.
func (r *Reconciler) upgradeManagedFields(ctx context.Context, svc *corev1.Service) error {
	patch, err := csaupgrade.UpgradeManagedFieldsPatch(svc, sets.New(r.fieldManager), r.fieldManager)
	if err != nil {
		return fmt.Errorf("computing the managedFields upgrade of Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	if patch == nil {
		return nil
	}
	upgraded, err := r.services.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: r.fieldManager})
	if err != nil {
		if !conflict(err) {
			r.metrics.Errors.WithLabelValues(metrics.OpUpgradeFields).Inc()
		}
		return fmt.Errorf("upgrading the managedFields of Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	r.metrics.ServiceWrites.WithLabelValues(metrics.OpUpgradeFields).Inc()
	*svc = *upgraded
	return nil
}

// clearSelector removes the selector of svc, if svc has not changed since it was read.
func (r *Reconciler) clearSelector(ctx context.Context, svc *corev1.Service) (*corev1.Service, error) {
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": svc.ResourceVersion},
		"spec":     map[string]any{"selector": nil},
	})
	if err != nil {
		return nil, fmt.Errorf("encoding the selector patch: %w", err)
	}
	cleared, err := r.services.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: r.fieldManager})
	if err != nil {
		if !conflict(err) {
			r.metrics.Errors.WithLabelValues(metrics.OpClearSelector).Inc()
		}
		return nil, fmt.Errorf("clearing the selector of Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	r.metrics.ServiceWrites.WithLabelValues(metrics.OpClearSelector).Inc()
	ctrl.LoggerFrom(ctx).Info("cleared the selector of the child Service", "service", client.ObjectKeyFromObject(svc))
	return cleared, nil
}

// selectsPods tells whether the selector of svc selects any pod of its namespace. It asks the
// API server (one pod at most) instead of caching every pod of the cluster: it is needed only
// while a Service is being adopted.
func (r *Reconciler) selectsPods(ctx context.Context, svc *corev1.Service) (bool, error) {
	var pods metav1.PartialObjectMetadataList
	pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	if err := r.reader.List(ctx, &pods, client.InNamespace(svc.Namespace), client.MatchingLabels(svc.Spec.Selector), client.Limit(1)); err != nil {
		r.metrics.Errors.WithLabelValues(metrics.OpRead).Inc()
		return false, fmt.Errorf("listing the pods Service %s/%s selects: %w", svc.Namespace, svc.Name, err)
	}
	return len(pods.Items) > 0, nil
}

func (r *Reconciler) writeCondition(err error) metav1.Condition {
	if apierrors.IsInvalid(err) {
		return metav1.Condition{
			Type: v1alpha1.ConditionServiceSynced, Status: metav1.ConditionFalse, Reason: childservice.ReasonInvalid,
			Message: "the API server rejected the Service this resource asks for: " + apiMessage(err),
		}
	}
	return writeFailed(err)
}

func writeFailed(err error) metav1.Condition {
	return metav1.Condition{
		Type: v1alpha1.ConditionServiceSynced, Status: metav1.ConditionFalse, Reason: childservice.ReasonWriteFailed,
		Message: "writing the Service failed and is retried: " + apiMessage(err),
	}
}

func apiMessage(err error) string {
	if se, ok := errors.AsType[*apierrors.StatusError](err); ok {
		return se.ErrStatus.Message
	}
	return err.Error()
}

// writeStatus writes the status computed from what was observed, unless it is unchanged, and
// records an Event when the ServiceSynced condition turns into a problem.
func (r *Reconciler) writeStatus(ctx context.Context, swh *v1alpha1.ServiceWithHealthchecks, out serviceOutcome, owned []discoveryv1.EndpointSlice, ports []v1alpha1.PortStatus) error {
	if err := ctx.Err(); err != nil {
		// Shutting down (or leadership lost): what failed is not the Service's problem.
		return err
	}
	prev := meta.FindStatusCondition(swh.Status.Conditions, v1alpha1.ConditionServiceSynced)
	if out.synced.Status == metav1.ConditionFalse && (prev == nil || prev.Status != out.synced.Status || prev.Reason != out.synced.Reason) {
		r.recorder.Eventf(swh, nil, corev1.EventTypeWarning, out.synced.Reason, "SyncService", "%s", out.synced.Message)
	}
	neighbours, err := r.collisionCandidates(ctx, swh)
	if err != nil {
		r.metrics.Errors.WithLabelValues(metrics.OpRead).Inc()
		return fmt.Errorf("reading the resources whose slice names may collide with %s/%s: %w", swh.Namespace, swh.Name, err)
	}
	computed := status.Compute(status.Observed{
		Resource:      swh,
		Service:       out.service,
		ServiceSynced: out.synced,
		Slices:        owned,
		Ports:         ports,
		Neighbours:    neighbours,
		Agents:        agentsStatus(r.agents),
		OverBudget:    overBudget(r.agents, client.ObjectKeyFromObject(swh), owned),
		Now:           metav1.NewTime(r.now()),
	})
	r.metrics.SetPorts(client.ObjectKeyFromObject(swh), computed.Ports)
	if !status.Changed(&swh.Status, &computed) {
		return nil
	}
	upd := swh.DeepCopy()
	upd.Status = computed
	if err := r.client.Status().Update(ctx, upd, client.FieldOwner(r.fieldManager)); err != nil {
		if !conflict(err) {
			r.metrics.Errors.WithLabelValues(metrics.OpUpdateStatus).Inc()
		}
		return fmt.Errorf("updating the status of %s/%s: %w", swh.Namespace, swh.Name, err)
	}
	r.metrics.StatusWrites.Inc()
	return nil
}

func conflict(err error) bool {
	return err != nil && apierrors.IsConflict(err)
}

func ignoreConflict(err error) error {
	if conflict(err) {
		return nil
	}
	return err
}
