// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package liveness

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

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
	// Budgets, optional, receives the probe-budget notes of the Leases read (budget.go).
	Budgets func(ctx context.Context, notes map[types.NamespacedName][]NodeBudget)

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

// Options configure Setup.
type Options struct {
	// Namespace holds the agents' node Leases.
	Namespace string
	// Grace is how long a renewTime may stand still (DefaultGrace when not positive).
	Grace time.Duration
	// Writer is the program's one EndpointSlice writer, through which endpoints are withdrawn.
	Writer *slicewrite.Writer
	// Metrics shows the judgement (metrics.Metrics.Liveness).
	Metrics *metrics.Liveness
}

// changesBuffer buffers node names whose judgement changed, on their way from the runner to the
// reconciler's queue.
const changesBuffer = 1024

// Agents is what the rest of the controller sees of the liveness: the latest judgement (for the
// AgentsStale condition) and the nodes whose judgement changed (a watch source of the
// reconciler). The runner writes both; the reconciler only reads.
type Agents struct {
	// Namespace holds the agents' node Leases.
	Namespace string
	// Runner is the leader-only runner Setup added to the manager.
	Runner *Runner

	board   *Board
	changes chan event.GenericEvent
	// budgets and budgetChanges are the probe-budget notes and their changes (budget.go).
	budgets       *budgetBoard
	budgetChanges chan event.GenericEvent
}

// Current is the latest judgement.
func (a *Agents) Current() Judgement { return a.board.Current() }

// Changes carries a metadata-only object named after every node whose judgement changed.
func (a *Agents) Changes() <-chan event.GenericEvent { return a.changes }

// notify hands the nodes to the reconciler's watch; it waits while the buffer is full, until
// ctx ends.
func (a *Agents) notify(ctx context.Context, nodes []string) {
	for _, n := range nodes {
		select {
		case a.changes <- event.GenericEvent{Object: &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: n}}}:
		case <-ctx.Done():
			return
		}
	}
}

// Setup adds the liveness runner to mgr (leader-only): the Leases in o.Namespace are judged with
// o.Grace (those of Nodes in mgr's cache), and our slices of stale nodes withdrawn through
// o.Writer. mgr's field indexer must hold index.SliceNode (index.Register, once per manager).
// Every verdict is published on the returned Agents.
func Setup(mgr ctrl.Manager, o Options) (*Agents, error) {
	log := mgr.GetLogger().WithName("liveness")
	a := &Agents{Namespace: o.Namespace, board: NewBoard(), changes: make(chan event.GenericEvent, changesBuffer),
		budgets: &budgetBoard{}, budgetChanges: make(chan event.GenericEvent, changesBuffer)}
	a.Runner = &Runner{
		Withdrawer: &Withdrawer{Client: mgr.GetClient(), Slices: o.Writer, Tracker: NewTracker(nil, o.Grace), Metrics: o.Metrics, Log: log,
			Board: a.board, Notify: a.notify},
		Leases:    mgr.GetAPIReader(),
		Nodes:     mgr.GetClient(),
		Namespace: o.Namespace,
		Log:       log,
		Budgets:   a.publishBudgets,
	}
	if err := mgr.Add(a.Runner); err != nil {
		return nil, fmt.Errorf("adding the liveness runner: %w", err)
	}
	return a, nil
}
