// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package liveness

import (
	"cmp"
	"context"
	"slices"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/deckhouse/service-with-healthchecks/api/probebudget"
)

// The probe budget as the agents report it (development/AGENT.md, "Probe budget"): each agent
// notes on its node Lease the resources whose targets there exceed its budget, and the runner,
// which reads those Leases anyway, hands the notes to the status writer (DESIGN §6: the status
// has one writer). Nothing else reads them.

// NodeBudget is one node's report on one resource over its agent's probe budget.
type NodeBudget struct {
	Node string
	// Budget is the agent's --max-probe-targets.
	Budget int
	// Asked is how many targets the resource has on the node, Allowed how many are probed.
	Asked, Allowed int
}

// BudgetNotes is the pure reading of the agents' Leases: by resource, the nodes that report it
// over budget, sorted by node. Leases of Nodes that do not exist, and notes that cannot be
// read, are skipped.
func BudgetNotes(leases []coordinationv1.Lease, nodes sets.Set[string]) map[types.NamespacedName][]NodeBudget {
	out := map[types.NamespacedName][]NodeBudget{}
	for i := range leases {
		l := &leases[i]
		value := l.Annotations[probebudget.Annotation]
		if value == "" {
			continue
		}
		node, _, ok := agentLease(l)
		if !ok || !nodes.Has(node) {
			continue
		}
		note, err := probebudget.Parse(value)
		if err != nil {
			continue
		}
		for _, o := range note.Over {
			key := types.NamespacedName{Namespace: o.Namespace, Name: o.Name}
			out[key] = append(out[key], NodeBudget{Node: node, Budget: note.Budget, Asked: o.Asked, Allowed: o.Allowed})
		}
	}
	for _, nbs := range out {
		slices.SortFunc(nbs, func(a, b NodeBudget) int { return cmp.Compare(a.Node, b.Node) })
	}
	return out
}

// budgetBoard holds the latest notes for the status writer; safe for concurrent use.
type budgetBoard struct {
	mu  sync.Mutex
	cur map[types.NamespacedName][]NodeBudget
}

// publish records the notes and returns the resources whose reports changed.
func (b *budgetBoard) publish(next map[types.NamespacedName][]NodeBudget) []types.NamespacedName {
	b.mu.Lock()
	defer b.mu.Unlock()
	var changed []types.NamespacedName
	for key, nbs := range next {
		if !slices.Equal(b.cur[key], nbs) {
			changed = append(changed, key)
		}
	}
	for key := range b.cur {
		if _, ok := next[key]; !ok {
			changed = append(changed, key)
		}
	}
	b.cur = next
	slices.SortFunc(changed, func(a, b types.NamespacedName) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return changed
}

// of is the reports on one resource (a copy).
func (b *budgetBoard) of(key types.NamespacedName) []NodeBudget {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.cur[key])
}

// OverBudget are the nodes whose agents report the resource over their probe budget, by node.
func (a *Agents) OverBudget(key types.NamespacedName) []NodeBudget { return a.budgets.of(key) }

// BudgetChanges carries a metadata-only object named after every resource whose budget
// reports changed (a watch source of the reconciler).
func (a *Agents) BudgetChanges() <-chan event.GenericEvent { return a.budgetChanges }

// publishBudgets publishes the notes of the Leases read and hands the resources whose reports
// changed to the reconciler's watch; it waits while the buffer is full, until ctx ends.
func (a *Agents) publishBudgets(ctx context.Context, notes map[types.NamespacedName][]NodeBudget) {
	for _, key := range a.budgets.publish(notes) {
		select {
		case a.budgetChanges <- event.GenericEvent{Object: &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}:
		case <-ctx.Done():
			return
		}
	}
}
