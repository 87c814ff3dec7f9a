// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package scheduler

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
)

func TestFairSharesBudget(t *testing.T) {
	tests := map[string]struct {
		budget  int
		demands []int
		want    []int
	}{
		"no bound meets every demand": {0, []int{5, 100000}, []int{5, 100000}},
		"no demand":                   {10, nil, []int{}},
		"everything fits":             {10, []int{3, 4}, []int{3, 4}},
		"one namespace alone takes the whole budget":       {10, []int{100000}, []int{10}},
		"a small demand keeps all of it, the rest goes on": {10, []int{100000, 1}, []int{9, 1}},
		"equal shares when every demand is over":           {9, []int{50, 50, 50}, []int{3, 3, 3}},
		"what a small demand leaves is shared by the rest": {10, []int{2, 100, 100}, []int{2, 4, 4}},
		"the remainder goes to the first in order":         {10, []int{100, 100, 100}, []int{4, 3, 3}},
		"the remainder follows the given order, not size":  {10, []int{1, 300, 200}, []int{1, 5, 4}},
		"zero demands take nothing":                        {4, []int{0, 7, 0}, []int{0, 4, 0}},
		"a budget smaller than the namespaces":             {2, []int{5, 5, 5}, []int{1, 1, 0}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := FairShares(tc.budget, tc.demands)
			assert.Equal(t, tc.want, got)
			if tc.budget > 0 {
				sum := 0
				for _, v := range got {
					sum += v
				}
				assert.LessOrEqual(t, sum, tc.budget, "the shares stay within the budget")
			}
		})
	}
}

// budgetTargets are n targets of a resource, in the order Set is given them.
func budgetTargets(resource types.NamespacedName, n int) []Target {
	ts := make([]Target, n)
	for i := range ts {
		t := target(fmt.Sprintf("pod-%05d", i), 0, time.Hour, 1, 1)
		t.Key.Resource = resource
		t.Namespace = resource.Namespace
		ts[i] = t
	}
	return ts
}

// keptPods are the pods of a resource's targets the scheduler keeps, sorted.
func keptPods(s *Scheduler, resource types.NamespacedName) []string {
	var out []string
	for uid := range s.Results(resource) {
		out = append(out, string(uid))
	}
	slices.Sort(out)
	return out
}

func TestSchedulerBudgetSharesTargetsBetweenNamespaces(t *testing.T) {
	var mu sync.Mutex
	var notified []types.NamespacedName
	m := metrics.New(nil)
	s := New(Options{MaxTargets: 10, Metrics: m, OnBudget: func(r types.NamespacedName) {
		mu.Lock()
		defer mu.Unlock()
		notified = append(notified, r)
	}})
	big1 := types.NamespacedName{Namespace: "big", Name: "a"}
	big2 := types.NamespacedName{Namespace: "big", Name: "b"}
	victim := types.NamespacedName{Namespace: "victim", Name: "v"}

	// One namespace alone may take the whole budget; its resources in name order.
	require.Equal(t, 6, s.Set(big1, budgetTargets(big1, 6)))
	require.Equal(t, 4, s.Set(big2, budgetTargets(big2, 100)), "b gets what a leaves")
	assert.Equal(t, 10, s.Len())
	assert.InDelta(t, 96.0, testutil.ToFloat64(m.TargetsOverBudget), 0)
	assert.InDelta(t, 10.0, testutil.ToFloat64(m.ProbeBudget), 0)

	// The victim's one target is admitted; the big namespace gives up its last one, b's.
	assert.Equal(t, 1, s.Admit(victim, 1))
	assert.Equal(t, 1, s.Set(victim, budgetTargets(victim, 1)))
	assert.Equal(t, 10, s.Len())
	assert.Equal(t, []string{"pod-00000", "pod-00001", "pod-00002"}, keptPods(s, big2), "b keeps its first targets")
	assert.Len(t, keptPods(s, big1), 6, "a, first by name, keeps all of its own")
	mu.Lock()
	assert.Equal(t, []types.NamespacedName{big2}, notified, "the resource whose allowance shrank is told")
	notified = nil
	mu.Unlock()

	rep := s.Budget()
	assert.Equal(t, BudgetReport{Budget: 10, Asked: 107, Admitted: 10,
		Over: []ResourceBudget{{Resource: big2, Asked: 100, Allowed: 3}}}, rep)
	allowed, ok := s.Allowed(big2)
	assert.True(t, ok)
	assert.Equal(t, 3, allowed)

	// A resync with the same targets changes nothing, and tells no one.
	assert.Equal(t, 3, s.Set(big2, budgetTargets(big2, 100)))
	assert.Equal(t, []string{"pod-00000", "pod-00001", "pod-00002"}, keptPods(s, big2))

	// The victim leaves: b gets its share back (and is told, to give its targets again).
	assert.Equal(t, 0, s.Set(victim, nil))
	mu.Lock()
	assert.Equal(t, []types.NamespacedName{big2}, notified)
	mu.Unlock()
	assert.Equal(t, 4, s.Set(big2, budgetTargets(big2, 100)))
	assert.Len(t, keptPods(s, big2), 4)
	_, ok = s.Allowed(victim)
	assert.False(t, ok, "a resource that asks for nothing is forgotten")
	assert.Empty(t, s.namespaces["victim"], "and so is its namespace")
}
