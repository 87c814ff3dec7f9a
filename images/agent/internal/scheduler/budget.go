// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package scheduler

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// The probe budget (development/AGENT.md, "Probe budget"). Options.MaxTargets bounds the
// targets the scheduler keeps: what one namespace asks for cannot grow the agent's memory and
// the dispatcher's work for every other namespace. The budget is shared between namespaces
// max-min fairly (FairShares): a namespace that asks for less than an equal share keeps all of
// it, and what it leaves is divided among the others. Within a namespace the targets are
// admitted in a fixed order: the resources by name, and each resource's targets in the order
// Set gives them (the agent gives them by pod name, then probe). So the same targets stay in
// budget across resyncs and restarts, and a namespace's growth pushes out its own last
// targets, never another namespace's share. A target over budget is not kept at all: Set
// keeps only the count the resource asked for.

// FairShares divides budget among demands max-min fairly (water-filling): every demand gets
// min(demand, level), where the level is the largest that keeps the sum within budget; what is
// left by rounding goes, one each, to the unsatisfied demands in their order. A budget of zero
// or less is no bound: every demand is met.
func FairShares(budget int, demands []int) []int {
	out := make([]int, len(demands))
	if budget <= 0 {
		copy(out, demands)
		return out
	}
	order := make([]int, len(demands))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(demands[a], demands[b]) })
	left := budget
	for n, i := range order {
		share := left / (len(order) - n)
		if demands[i] > share {
			// This one and every larger demand get the level; the remainder goes one each to
			// the first of them in their given order.
			rest := order[n:]
			rem := left - share*len(rest)
			slices.Sort(rest)
			for _, j := range rest {
				out[j] = share
				if rem > 0 {
					out[j]++
					rem--
				}
			}
			return out
		}
		out[i] = max(demands[i], 0)
		left -= out[i]
	}
	return out
}

// ResourceBudget is a resource whose targets on this node exceed its share of the budget.
type ResourceBudget struct {
	Resource types.NamespacedName
	// Asked is how many targets the resource has on this node; Allowed how many are probed.
	Asked, Allowed int
}

// BudgetReport is the budget and who is over it (Scheduler.Budget).
type BudgetReport struct {
	// Budget is Options.MaxTargets (0: no bound).
	Budget int
	// Asked is how many targets every resource asked for; Admitted how many are kept.
	Asked, Admitted int
	// Over are the resources with targets over budget, by namespace and name.
	Over []ResourceBudget
}

// Budget reports the budget and the resources over it.
func (s *Scheduler) Budget() BudgetReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	rep := BudgetReport{Budget: max(s.opts.MaxTargets, 0), Asked: s.asked, Admitted: len(s.targets)}
	for _, ns := range s.namespaces {
		for _, r := range ns.res {
			if r.allowed < r.asked {
				rep.Over = append(rep.Over, ResourceBudget{Resource: r.name, Asked: r.asked, Allowed: r.allowed})
			}
		}
	}
	slices.SortFunc(rep.Over, func(a, b ResourceBudget) int {
		return cmp.Or(cmp.Compare(a.Resource.Namespace, b.Resource.Namespace), cmp.Compare(a.Resource.Name, b.Resource.Name))
	})
	return rep
}

// Allowed is how many of a resource's targets, in the order Set was given them, are within
// budget; ok is false when the scheduler does not know the resource (it asked for nothing yet).
func (s *Scheduler) Allowed(resource types.NamespacedName) (allowed int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.resources[resource]
	if r == nil || r.asked == 0 {
		return 0, false
	}
	return r.allowed, true
}

// askLocked records how many targets a resource asks for, keeping its namespace's list of
// asking resources sorted by name.
func (s *Scheduler) askLocked(r *resState, asked int) {
	if r.asked == asked {
		return
	}
	ns := r.ns
	i, found := slices.BinarySearchFunc(ns.res, r.name.Name, func(x *resState, name string) int { return cmp.Compare(x.name.Name, name) })
	switch {
	case asked > 0 && !found:
		ns.res = slices.Insert(ns.res, i, r)
	case asked == 0 && found:
		ns.res = slices.Delete(ns.res, i, i+1)
	}
	if asked == 0 {
		// Out of its namespace's list: allocateLocked no longer sees it.
		r.allowed = 0
	}
	ns.asked += asked - r.asked
	s.asked += asked - r.asked
	r.asked = asked
}

// allocateLocked shares the budget out again after a resource's demand changed: every
// namespace's share (FairShares), then, in the namespaces whose share changed and in changedNS,
// each resource's allowance in name order. It returns the resources whose allowance changed.
func (s *Scheduler) allocateLocked(changedNS *nsState) []*resState {
	// By name: FairShares hands the remainder of the division out in this order.
	all := make([]*nsState, 0, len(s.namespaces))
	for _, ns := range s.namespaces {
		all = append(all, ns)
	}
	slices.SortFunc(all, func(a, b *nsState) int { return cmp.Compare(a.name, b.name) })
	demands := make([]int, len(all))
	for i, ns := range all {
		demands[i] = ns.asked
	}
	shares := FairShares(s.opts.MaxTargets, demands)
	var changed []*resState
	for i, ns := range all {
		if shares[i] == ns.allowed && ns != changedNS {
			continue
		}
		ns.allowed = shares[i]
		left := ns.allowed
		for _, r := range ns.res {
			allowed := min(r.asked, left)
			left -= allowed
			if allowed != r.allowed {
				r.allowed = allowed
				changed = append(changed, r)
			}
		}
	}
	return changed
}

// trimLocked forgets the targets of a resource that its allowance no longer covers (those Set
// placed at or after the allowance).
func (s *Scheduler) trimLocked(r *resState) {
	for k, e := range r.entries {
		if e.ordinal >= r.allowed {
			s.removeLocked(k, e)
		}
	}
}
