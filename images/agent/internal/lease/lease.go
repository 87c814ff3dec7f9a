// Package lease renews the agent's node Lease (coordination.k8s.io/v1) so that the controller
// can tell a live agent from a lost one (DESIGN §5). The controller judges staleness on its own
// clock from renewTime changes; this package only keeps renewing, through API errors, until its
// context ends.
package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
)

// Defaults of the renewal.
const (
	// DefaultRenewInterval is how often the Lease is renewed.
	DefaultRenewInterval = 10 * time.Second
	// DefaultDuration is the leaseDurationSeconds written (informational: the controller uses
	// its own grace on its own clock).
	DefaultDuration = 40 * time.Second
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
			r.Log.Error(err, "renewing the node Lease failed, retrying", "namespace", r.Namespace, "lease", slicemeta.AgentLeaseName(r.Node))
			failing = true
			if r.Metrics != nil {
				r.Metrics.LeaseRenewErrors.Inc()
			}
		} else {
			if r.Metrics != nil {
				r.Metrics.LeaseLastRenew.Set(float64(clk.Now().UnixNano()) / 1e9)
			}
			if failing {
				r.Log.Info("renewing the node Lease works again", "namespace", r.Namespace, "lease", slicemeta.AgentLeaseName(r.Node))
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
// holder, duration and node metadata when they drifted).
func (r *Renewer) Renew(ctx context.Context) error {
	now := metav1.NewMicroTime(r.clock().Now())
	name := slicemeta.AgentLeaseName(r.Node)
	var l coordinationv1.Lease
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: name}, &l)
	switch {
	case apierrors.IsNotFound(err):
		l = coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: name}}
		r.fill(&l, now)
		if err := r.Client.Create(ctx, &l); err != nil {
			return fmt.Errorf("creating Lease %s/%s: %w", r.Namespace, name, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("reading Lease %s/%s: %w", r.Namespace, name, err)
	}
	r.fill(&l, now)
	if err := r.Client.Update(ctx, &l); err != nil {
		return fmt.Errorf("renewing Lease %s/%s: %w", r.Namespace, name, err)
	}
	return nil
}

func (r *Renewer) fill(l *coordinationv1.Lease, now metav1.MicroTime) {
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
	l.Annotations[slicemeta.AnnotationNode] = r.Node
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	if len(validation.IsValidLabelValue(r.Node)) == 0 {
		l.Labels[slicemeta.LabelNode] = r.Node
	}
}

func (r *Renewer) clock() clock.WithTicker {
	if r.Clock == nil {
		return clock.RealClock{}
	}
	return r.Clock
}
