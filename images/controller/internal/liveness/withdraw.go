// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package liveness

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/slicewrite"
)

// Plan is the pure decision: of the given slices, those that are ours (managed by this module
// and owned by the live resource whose UID owners holds under the slice's namespace and
// resource label) and were published for one of the nodes, with at least one endpoint not yet
// withdrawn. It returns modified copies, sorted by namespace and name; the input is untouched.
// Each copy carries at, when the nodes were judged gone, as its trigger time
// (endpoints.kubernetes.io/last-change-trigger-time, kube-proxy's network programming latency),
// unless at is zero.
func Plan(sliceList []discoveryv1.EndpointSlice, owners map[types.NamespacedName]types.UID, nodes []string, at time.Time) []*discoveryv1.EndpointSlice {
	if len(nodes) == 0 {
		return nil
	}
	stale := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		stale[n] = true
	}
	var out []*discoveryv1.EndpointSlice
	for i := range sliceList {
		s := &sliceList[i]
		if !stale[slicemeta.NodeOf(s)] {
			continue
		}
		uid := owners[types.NamespacedName{Namespace: s.Namespace, Name: s.Labels[wellknown.LabelResource]}]
		if !slicemeta.IsOwnedBy(s, uid) {
			continue
		}
		if !anyUp(s) {
			continue
		}
		c := s.DeepCopy()
		no := false
		for j := range c.Endpoints {
			c.Endpoints[j].Conditions.Ready = &no
			c.Endpoints[j].Conditions.Serving = &no
		}
		if !at.IsZero() {
			if c.Annotations == nil {
				c.Annotations = map[string]string{}
			}
			c.Annotations[corev1.EndpointsLastChangeTriggerTime] = at.Format(time.RFC3339Nano)
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// anyUp tells whether an endpoint of the slice is not yet withdrawn. A nil condition counts as
// up: consumers read a nil ready or serving as true.
func anyUp(s *discoveryv1.EndpointSlice) bool {
	for _, e := range s.Endpoints {
		c := e.Conditions
		if c.Ready == nil || *c.Ready || c.Serving == nil || *c.Serving {
			return true
		}
	}
	return false
}

// Withdrawer acts on the judgement: it asks the tracker for a verdict (decide), publishes it,
// reads the slices of the stale nodes (observe), asks Plan (decide) and withdraws through the
// slice writer (apply), unless the guard holds.
type Withdrawer struct {
	// Client reads resources and slices. It must read from a cache that holds
	// index.SliceNode (index.Register).
	Client client.Reader
	// Slices is the program's one EndpointSlice writer, through which the endpoints are
	// withdrawn.
	Slices *slicewrite.Writer
	// Tracker judges the agents.
	Tracker *Tracker
	// Metrics, optional.
	Metrics *metrics.Liveness
	// Log receives what was withdrawn and why nothing was.
	Log logr.Logger
	// Board, optional, receives every verdict for the status writer (the AgentsStale
	// condition), before anything is withdrawn.
	Board *Board
	// Notify, optional, is called with the nodes whose judgement changed on the Board, so that
	// the status of the resources with endpoints on them is computed again.
	Notify func(ctx context.Context, nodes []string)
}

// Run judges the agents once and withdraws what the verdict says. It returns the verdict (the
// caller runs again after its NextCheck, and shows a holding guard) and the first error;
// slices that could not be written are retried by the next run.
func (w *Withdrawer) Run(ctx context.Context) (Verdict, error) {
	v := w.Tracker.Judge()
	if m := w.Metrics; m != nil {
		m.SetVerdict(v.Known, v.Stale, v.Guarded)
	}
	if w.Board != nil {
		if changed := w.Board.Publish(v); len(changed) > 0 && w.Notify != nil {
			w.Notify(ctx, changed)
		}
	}
	if v.Guarded {
		w.Log.Info("liveness guard holds, withdrawing nothing", "reason", v.Reason, "stale", v.Stale, "late", v.Late)
		return v, nil
	}
	nodes := v.Withdraw()
	if len(nodes) == 0 {
		return v, nil
	}
	plan, err := w.observeSlices(ctx, nodes, v.At)
	if err != nil {
		w.countError()
		return v, err
	}
	return v, w.withdraw(ctx, plan)
}

// WithdrawWriters is how many slice updates of a withdrawal are in flight at once. One at a
// time, a lost zone's slices (10 resources on each of 500 nodes: 5,000 updates) took as many
// round trips in a row, and on a loaded API server the last was written long after the grace
// (development/BENCHMARKS-HISTORY.md, "Where the 5,000-node withdrawal's time goes"); the
// client's rate limit (--kube-api-qps) still bounds the whole.
const WithdrawWriters = 8

// withdraw writes the plan's slices, WithdrawWriters at a time, and returns every failure.
func (w *Withdrawer) withdraw(ctx context.Context, plan []*discoveryv1.EndpointSlice) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	sem := make(chan struct{}, WithdrawWriters)
	for _, s := range plan {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			// The writer counts the withdrawal, or its failure.
			if err := w.Slices.Withdraw(ctx, s); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("node %s: %w", slicemeta.NodeOf(s), err))
				mu.Unlock()
				return
			}
			w.Log.Info("withdrew the endpoints of a stale node", "namespace", s.Namespace, "slice", s.Name, "node", slicemeta.NodeOf(s), "endpoints", len(s.Endpoints))
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (w *Withdrawer) countError() {
	if w.Metrics != nil {
		w.Metrics.Errors.Inc()
	}
}
