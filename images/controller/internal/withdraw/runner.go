// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package withdraw

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/liveness"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/slicewrite"
)

// Runner watches the agents' node Leases, feeds the tracker and runs the withdrawer. It runs on
// the leader only: its start is the moment leadership is won, and the grace restarts then.
type Runner struct {
	// Withdrawer judges (through its Tracker) and writes.
	Withdrawer *Withdrawer
	// Leases reads the agents' Leases, uncached, so that a failing API server shows as an
	// error (blindness) rather than as a frozen cache.
	Leases client.Reader
	// Nodes lists the Nodes (metadata only; the manager's cache): a Lease whose Node does not
	// exist is ignored.
	Nodes client.Reader
	// Namespace is the agent lease namespace.
	Namespace string
	// Period between observations; DefaultPeriod(grace) when zero.
	Period time.Duration
	// Clock ticks the observations; the real clock when nil.
	Clock clock.WithTicker
	// Log receives observation failures.
	Log logr.Logger

	known   map[string]bool
	orphans map[string]bool
}

// DefaultPeriod is the observation period for a grace: an eighth of it, between 0.5 s and 5 s.
func DefaultPeriod(grace time.Duration) time.Duration {
	return min(max(grace/8, 500*time.Millisecond), 5*time.Second)
}

// NeedLeaderElection makes the manager start the runner only once this replica leads.
func (r *Runner) NeedLeaderElection() bool { return true }

// Start restarts the grace (leadership was just won) and then observes the Leases every Period
// until ctx ends. A failed observation makes the controller blind: the first successful one
// after it restarts the grace again, so that agents are not blamed for the controller's or the
// API server's outage.
func (r *Runner) Start(ctx context.Context) error {
	if r.Nodes == nil || r.Leases == nil {
		return errors.New("liveness runner: Leases and Nodes must both be set")
	}
	tr := r.Withdrawer.Tracker
	tr.Reset()
	period := r.Period
	if period <= 0 {
		period = DefaultPeriod(tr.Grace())
	}
	clk := r.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	ticker := clk.NewTicker(period)
	defer ticker.Stop()
	blind := false
	for {
		if err := r.observe(ctx, period); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !blind {
				r.Log.Error(err, "cannot see the agents' Leases; withdrawing nothing until they are seen again, then restarting the grace")
			}
			blind = true
			r.Withdrawer.countError()
		} else {
			if blind {
				r.Log.Info("the agents' Leases are visible again; restarting the grace")
				tr.Reset()
				blind = false
			}
			if _, err := r.Withdrawer.Run(ctx); err != nil && ctx.Err() == nil {
				r.Log.Error(err, "withdrawing the endpoints of stale nodes failed; retrying")
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
		}
	}
}

// observe lists the agents' Leases and the Nodes and feeds the tracker; nodes whose Lease is
// gone, or whose Node is, are forgotten (their stale-node series go with them).
func (r *Runner) observe(ctx context.Context, period time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, max(2*period, 5*time.Second))
	defer cancel()
	var leases coordinationv1.LeaseList
	if err := r.Leases.List(ctx, &leases, client.InNamespace(r.Namespace)); err != nil {
		return fmt.Errorf("listing Leases in %s: %w", r.Namespace, err)
	}
	var nodeList metav1.PartialObjectMetadataList
	nodeList.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	// The cache's own objects (no copy), only read: a list of every Node on each observation.
	if err := r.Nodes.List(ctx, &nodeList, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing Nodes: %w", err)
	}
	nodes := sets.New[string]()
	for i := range nodeList.Items {
		nodes.Insert(nodeList.Items[i].Name)
	}
	renewals, orphans := AgentRenewals(leases.Items, nodes)
	seen := make(map[string]bool, len(renewals))
	for node, renew := range renewals {
		seen[node] = true
		r.Withdrawer.Tracker.Observe(node, renew)
	}
	for node := range r.known {
		if !seen[node] {
			r.Withdrawer.Tracker.Forget(node)
		}
	}
	r.known = seen
	now := make(map[string]bool, len(orphans))
	for _, node := range orphans {
		now[node] = true
		if !r.orphans[node] {
			r.Log.Info("ignoring the Lease of a node that does not exist (the garbage collector removes it with its Node)",
				"namespace", r.Namespace, "lease", slicemeta.AgentLeaseName(node), "node", node)
		}
	}
	r.orphans = now
	return nil
}

// AgentRenewals is the pure reading of the Leases in the lease namespace: the renewTime of
// every agent's Lease, by node, for the nodes that exist; and, sorted, the nodes of agents'
// Leases whose Node does not exist (ignored: their agents are gone with their nodes, and counting
// them would hold the guard forever once they outnumber the live agents). Other Leases are
// skipped (agentLease).
func AgentRenewals(leases []coordinationv1.Lease, nodes sets.Set[string]) (renewals map[string]time.Time, orphans []string) {
	renewals = make(map[string]time.Time, len(leases))
	for i := range leases {
		node, renew, ok := agentLease(&leases[i])
		if !ok {
			continue
		}
		if !nodes.Has(node) {
			orphans = append(orphans, node)
			continue
		}
		renewals[node] = renew
	}
	sort.Strings(orphans)
	return renewals, orphans
}

// agentLease reads the node and renewTime of an agent's Lease; ok is false for other Leases and
// for one not yet renewed.
func agentLease(l *coordinationv1.Lease) (node string, renew time.Time, ok bool) {
	if !strings.HasPrefix(l.Name, slicemeta.AgentLeasePrefix) || l.Spec.RenewTime == nil {
		return "", time.Time{}, false
	}
	node = l.Annotations[slicemeta.AnnotationNode]
	if node == "" && l.Spec.HolderIdentity != nil {
		node = *l.Spec.HolderIdentity
	}
	if node == "" || slicemeta.AgentLeaseName(node) != l.Name {
		return "", time.Time{}, false
	}
	return node, l.Spec.RenewTime.Time, true
}

// Setup adds the liveness runner to mgr: Leases in namespace are judged with grace (those of
// Nodes in mgr's cache), our slices of stale nodes withdrawn through writer (the program's one
// slice writer), the judgement shown in m (metrics.NewLiveness). mgr's field indexer must hold
// index.SliceNode (index.Register, once per manager). Every verdict is published on board
// (optional), and notify (optional) hears which nodes' judgement changed.
func Setup(mgr ctrl.Manager, writer *slicewrite.Writer, m *metrics.Liveness, namespace string, grace time.Duration, board *liveness.Board, notify func(context.Context, []string)) (*Runner, error) {
	log := mgr.GetLogger().WithName("liveness")
	r := &Runner{
		Withdrawer: &Withdrawer{Client: mgr.GetClient(), Slices: writer, Tracker: liveness.NewTracker(nil, grace), Metrics: m, Log: log,
			Board: board, Notify: notify},
		Leases:    mgr.GetAPIReader(),
		Nodes:     mgr.GetClient(),
		Namespace: namespace,
		Log:       log,
	}
	if err := mgr.Add(r); err != nil {
		return nil, fmt.Errorf("adding the liveness runner: %w", err)
	}
	return r, nil
}
