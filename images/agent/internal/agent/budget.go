// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/deckhouse/service-with-healthchecks/api/probebudget"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/scheduler"
	"github.com/deckhouse/service-with-healthchecks/lib/eventnote"
)

// ReasonProbeBudgetExceeded is the agent's Event on a resource whose targets on this node
// turned over the probe budget (development/AGENT.md, "Probe budget").
const ReasonProbeBudgetExceeded = "ProbeBudgetExceeded"

// decide is Decide under the node's probe budget. The scheduler is told how many targets the
// resource asks for (Admit) before anything is written; when that moves its allowance from the
// one observed, the resource is decided again with the new one, so a reconcile publishes the
// targets over budget as such at once, and never publishes one as over budget that is not.
func (r *Reconciler) decide(o Observed) Decision {
	d := Decide(o)
	res := types.NamespacedName{Namespace: o.Resource.Namespace, Name: o.Resource.Name}
	n := len(d.Targets)
	allowed := r.Scheduler.Admit(res, n)
	if effective(o.Budget, n) != min(allowed, n) {
		o.Budget = Budget{Limited: true, Allowed: allowed}
		d = Decide(o)
	}
	d.Allowed = min(allowed, n)
	return d
}

// effective is how many of n targets b allows.
func effective(b Budget, n int) int {
	if !b.Limited {
		return n
	}
	return min(b.Allowed, n)
}

// budgetChanged reconciles a resource whose allowance another namespace's demand changed (the
// scheduler's OnBudget): its targets over budget are published as such, or probed again.
func (r *Reconciler) budgetChanged(res types.NamespacedName) {
	if q := r.queue.get(); q != nil {
		q.Add(reconcile.Request{NamespacedName: res})
	}
}

// budgetNotes remembers which resources are over budget, so that the Event is recorded once
// when a resource turns over budget, not on every reconcile while it stays there.
type budgetNotes struct {
	mu   sync.Mutex
	over map[types.NamespacedName]bool
}

func newBudgetNotes() *budgetNotes {
	return &budgetNotes{over: map[types.NamespacedName]bool{}}
}

// turnedOver records whether the resource is over budget now and tells whether it was not.
func (b *budgetNotes) turnedOver(res types.NamespacedName, over bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	was := b.over[res]
	if over {
		b.over[res] = true
	} else {
		delete(b.over, res)
	}
	return over && !was
}

// recordBudget records the Event of a resource that turned over budget.
func (r *Reconciler) recordBudget(o Observed, d Decision) {
	res := types.NamespacedName{Namespace: o.Resource.Namespace, Name: o.Resource.Name}
	if !r.budget.turnedOver(res, d.Allowed < len(d.Targets)) {
		return
	}
	// The action names the numbers (Probe/budget/<over>-of-<targets>), the parts of the note
	// that change: a resource over budget again with other numbers is another Event, not a
	// series of the first one's note.
	over := len(d.Targets) - d.Allowed
	r.Recorder.Eventf(o.Resource, nil, corev1.EventTypeWarning, ReasonProbeBudgetExceeded,
		budgetAction(over, len(d.Targets)),
		"%d of the %d probe targets (pod × probe) of this resource on node %s are over the agent's probe budget (its namespace's share of --max-probe-targets): they are not probed and their ports are published not serving",
		over, len(d.Targets), r.Node)
}

// BudgetNote is what the agent reports on its node Lease about the budget
// (probebudget.Annotation): the budget and the resources over it, with their numbers.
func BudgetNote(s *scheduler.Scheduler) string {
	rep := s.Budget()
	if len(rep.Over) == 0 {
		return ""
	}
	n := probebudget.Note{Budget: rep.Budget, Over: make([]probebudget.Resource, 0, len(rep.Over))}
	for _, o := range rep.Over {
		n.Over = append(n.Over, probebudget.Resource{Namespace: o.Resource.Namespace, Name: o.Resource.Name, Asked: o.Asked, Allowed: o.Allowed})
	}
	return probebudget.Encode(n)
}

// budgetOf is the resource's allowance as the scheduler last shared the budget out.
func (r *Reconciler) budgetOf(res types.NamespacedName) Budget {
	allowed, ok := r.Scheduler.Allowed(res)
	return Budget{Limited: ok, Allowed: allowed}
}

// budgetAction is the action of a ProbeBudgetExceeded Event: Probe/budget/<over>-of-<targets>,
// the parts of its note that change.
func budgetAction(over, targets int) string {
	return eventnote.Action("Probe", "budget", strconv.Itoa(over)+"-of-"+strconv.Itoa(targets))
}
