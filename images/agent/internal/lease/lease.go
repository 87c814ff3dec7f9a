// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package lease renews the agent's node Lease (coordination.k8s.io/v1) so that the controller
// can tell a live agent from a lost one (DESIGN §5). The controller judges staleness on its own
// clock from renewTime changes; this package only keeps renewing, through API errors, until its
// context ends.
//
// The Lease is owned by its Node (by UID), so that the garbage collector removes it with the
// Node: a Lease is never written for a Node that does not exist, and a re-created Node (a new
// UID) gets the owner reference re-pointed at it.
package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/probebudget"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
)

// Defaults of the renewal.
const (
	// DefaultRenewInterval is how often the Lease is renewed.
	DefaultRenewInterval = 10 * time.Second
	// DefaultDuration is the leaseDurationSeconds written (informational: the controller uses
	// its own grace on its own clock).
	DefaultDuration = 40 * time.Second
	// DefaultNodeCheckInterval is how often the Node is read again to see whether it was
	// re-created with a new UID, which the Lease's owner reference must follow. Between checks a
	// renewal reads only the Lease.
	DefaultNodeCheckInterval = time.Minute
)

// Renewer keeps one node's Lease renewed.
type Renewer struct {
	// Client writes the Lease.
	Client client.Client
	// Namespace is the lease namespace.
	Namespace string
	// Node is the full node name (the holderIdentity).
	Node string
	// Interval between renewals; DefaultRenewInterval when zero.
	Interval time.Duration
	// Duration written as leaseDurationSeconds; DefaultDuration when zero.
	Duration time.Duration
	// Clock is the clock of renewTime and of the interval; the real clock when nil.
	Clock clock.WithTicker
	// Log receives renewal failures.
	Log logr.Logger
	// Metrics, optional, receive the last renewal time and the failures.
	Metrics *metrics.Metrics
	// NodeCheckInterval is how often the Node's UID is read again; DefaultNodeCheckInterval
	// when zero. It is also read whenever the Lease is created or is not owned by the UID last
	// read.
	NodeCheckInterval time.Duration

	// Note, optional, is the probe-budget note written into the Lease's
	// probebudget.Annotation at each renewal ("" removes it): the controller shows it as the
	// ProbeBudgetExceeded condition.
	Note func() string

	// nodeUID is the Node's UID as last read, at nodeChecked (Renew is not concurrent: Start
	// calls it from one goroutine).
	nodeUID     types.UID
	nodeChecked time.Time
}

// Start renews the Lease immediately and then every Interval until ctx ends. It never returns
// an error for a failed renewal: it logs it and tries again at the next tick. It satisfies
// controller-runtime's manager.Runnable.
func (r *Renewer) Start(ctx context.Context) error {
	if r.Node == "" || r.Namespace == "" {
		return fmt.Errorf("lease renewer: node %q and namespace %q must both be set", r.Node, r.Namespace)
	}
	clk := r.clock()
	interval := r.Interval
	if interval <= 0 {
		interval = DefaultRenewInterval
	}
	ticker := clk.NewTicker(interval)
	defer ticker.Stop()
	failing := false
	for {
		if err := r.Renew(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.Log.Error(err, "renewing the node Lease failed, retrying", "namespace", r.Namespace, "lease", wellknown.AgentLeaseName(r.Node))
			failing = true
			if r.Metrics != nil {
				r.Metrics.LeaseRenewErrors.Inc()
			}
		} else {
			if r.Metrics != nil {
				r.Metrics.LeaseLastRenew.Set(float64(clk.Now().UnixNano()) / 1e9)
			}
			if failing {
				r.Log.Info("renewing the node Lease works again", "namespace", r.Namespace, "lease", wellknown.AgentLeaseName(r.Node))
				failing = false
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
		}
	}
}

// NeedLeaderElection tells the manager to run the renewer on every agent, not only a leader.
func (r *Renewer) NeedLeaderElection() bool { return false }

// Renew writes one renewal: creates the Lease when missing, else updates renewTime (and the
// holder, duration, owner and node metadata when they drifted). It writes nothing while the
// Node does not exist: a Lease written then would be owned by nothing and outlive the Node.
// Renew must not be called concurrently.
func (r *Renewer) Renew(ctx context.Context) error {
	at := r.clock().Now()
	name := wellknown.AgentLeaseName(r.Node)
	var l coordinationv1.Lease
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: name}, &l)
	found := true
	switch {
	case apierrors.IsNotFound(err):
		found = false
		l = coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: name}}
	case err != nil:
		return fmt.Errorf("reading Lease %s/%s: %w", r.Namespace, name, err)
	}
	uid, err := r.ownerUID(ctx, at, NodeOwnerUID(&l, r.Node))
	if err != nil {
		return err
	}
	r.fill(&l, metav1.NewMicroTime(at), uid)
	if !found {
		if err := r.Client.Create(ctx, &l); err != nil {
			return fmt.Errorf("creating Lease %s/%s: %w", r.Namespace, name, err)
		}
		return nil
	}
	if err := r.Client.Update(ctx, &l); err != nil {
		return fmt.Errorf("renewing Lease %s/%s: %w", r.Namespace, name, err)
	}
	return nil
}

// ownerUID is the UID of the Node the Lease must be owned by. current is the UID the Lease is
// owned by now ("" for none). The Node is read when the Lease has no owner or another one than
// last read, and every NodeCheckInterval; a failed read keeps a Lease that has an owner
// renewed as it is, and stops the renewal of one that has none.
func (r *Renewer) ownerUID(ctx context.Context, at time.Time, current types.UID) (types.UID, error) {
	interval := r.NodeCheckInterval
	if interval <= 0 {
		interval = DefaultNodeCheckInterval
	}
	if current != "" && current == r.nodeUID && at.Sub(r.nodeChecked) < interval {
		return current, nil
	}
	node := &metav1.PartialObjectMetadata{}
	node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	err := r.Client.Get(ctx, types.NamespacedName{Name: r.Node}, node)
	switch {
	case apierrors.IsNotFound(err):
		r.nodeUID = ""
		return "", fmt.Errorf("node %s does not exist: its Lease is not written, it would outlive the node (a Lease is owned by its Node)", r.Node)
	case err != nil && current != "":
		r.Log.V(1).Info("reading the node failed; renewing the Lease with its owner as it is", "node", r.Node, "error", err.Error())
		return current, nil
	case err != nil:
		return "", fmt.Errorf("reading node %s, which owns its Lease: %w", r.Node, err)
	}
	if current != "" && current != node.UID {
		r.Log.Info("the node was re-created: pointing its Lease's owner at the new Node", "node", r.Node, "oldUID", current, "uid", node.UID)
	}
	r.nodeUID, r.nodeChecked = node.UID, at
	return node.UID, nil
}

// NodeOwnerUID is the UID of the Node named node that owns the Lease, or "" when no owner
// reference names that Node.
func NodeOwnerUID(l *coordinationv1.Lease, node string) types.UID {
	for _, ref := range l.OwnerReferences {
		if ref.APIVersion == "v1" && ref.Kind == "Node" && ref.Name == node {
			return ref.UID
		}
	}
	return ""
}

// fill sets what the Lease says: its holder, times and node metadata, and its only owner, the
// Node (no blockOwnerDeletion: nothing is to wait for the Lease, and setting it would need
// update on nodes/finalizers under OwnerReferencesPermissionEnforcement). The agent's admission
// policy admits no other owner.
func (r *Renewer) fill(l *coordinationv1.Lease, now metav1.MicroTime, nodeUID types.UID) {
	l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: r.Node, UID: nodeUID}}
	duration := r.Duration
	if duration <= 0 {
		duration = DefaultDuration
	}
	seconds := int32(duration / time.Second)
	holder := r.Node
	l.Spec.HolderIdentity = &holder
	l.Spec.LeaseDurationSeconds = &seconds
	l.Spec.RenewTime = &now
	if l.Spec.AcquireTime == nil {
		l.Spec.AcquireTime = &now
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[wellknown.AnnotationNode] = r.Node
	if r.Note != nil {
		if note := r.Note(); note != "" {
			l.Annotations[probebudget.Annotation] = note
		} else {
			delete(l.Annotations, probebudget.Annotation)
		}
	}
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	if len(validation.IsValidLabelValue(r.Node)) == 0 {
		l.Labels[wellknown.LabelNode] = r.Node
	}
}

func (r *Renewer) clock() clock.WithTicker {
	if r.Clock == nil {
		return clock.RealClock{}
	}
	return r.Clock
}
