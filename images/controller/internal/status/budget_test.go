// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package status

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

func TestProbeBudgetCondition(t *testing.T) {
	exceeded := []metav1.Condition{{Type: v1alpha1.ConditionProbeBudgetExceeded, Status: metav1.ConditionTrue}}
	seven := make([]NodeBudget, 7)
	for i := range seven {
		seven[i] = NodeBudget{Node: fmt.Sprintf("n%d", i), Budget: 100, Asked: 10, Allowed: 4}
	}
	tests := map[string]struct {
		current  []metav1.Condition
		over     []NodeBudget
		want     metav1.ConditionStatus // "" for no condition
		contains []string
		excludes []string
	}{
		"never over budget: no condition": {},
		"within budget again: False":      {current: exceeded, want: metav1.ConditionFalse, contains: []string{"within"}},
		"one node, with the numbers": {
			over: []NodeBudget{{Node: "node-a", Budget: 2, Asked: 3, Allowed: 1}}, want: metav1.ConditionTrue,
			contains: []string{"2 of 3 probe targets (pod × probe) on 1 nodes", "node node-a: 1 of 3 probed (budget 2 per node)", "agent.maxProbeTargets"},
		},
		"many nodes: the message names five and counts the rest": {
			over: seven, want: metav1.ConditionTrue,
			contains: []string{"42 of 70 probe targets", "node n4: 4 of 10", "and 2 more nodes"}, excludes: []string{"node n5"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := probeBudget(tc.current, tc.over)
			if tc.want == "" {
				assert.Nil(t, c)
				return
			}
			if assert.NotNil(t, c) {
				assert.Equal(t, tc.want, c.Status)
				assert.Equal(t, v1alpha1.ConditionProbeBudgetExceeded, c.Type)
				for _, s := range tc.contains {
					assert.Contains(t, c.Message, s)
				}
				for _, s := range tc.excludes {
					assert.NotContains(t, c.Message, s)
				}
			}
		})
	}
}
