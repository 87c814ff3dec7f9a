// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package status

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
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

// TestBudgetNotesOnlyFromNodesWithPods: a node's budget note counts only for a resource with an
// endpoint on that node (verified by the audit before the status sees it); a note about a
// resource the node has no pod of, or only an emptied slice, is not believed.
func TestBudgetNotesOnlyFromNodesWithPods(t *testing.T) {
	onNode := func(node string, endpoints int) discoveryv1.EndpointSlice {
		s := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Labels: slicemeta.SliceKey{Resource: "r", Node: node}.Labels()}}
		s.Endpoints = make([]discoveryv1.Endpoint, endpoints)
		return s
	}
	over := []NodeBudget{{Node: "a", Budget: 10}, {Node: "b", Budget: 10}, {Node: "c", Budget: 10}}
	tests := map[string]struct {
		slices []discoveryv1.EndpointSlice
		want   []string
	}{
		"no slices: no note believed":         {nil, nil},
		"a node with pods":                    {[]discoveryv1.EndpointSlice{onNode("b", 1)}, []string{"b"}},
		"an empty slice is no pod":            {[]discoveryv1.EndpointSlice{onNode("a", 0), onNode("c", 2)}, []string{"c"}},
		"every node with pods, in the order":  {[]discoveryv1.EndpointSlice{onNode("c", 1), onNode("a", 1)}, []string{"a", "c"}},
		"a node that made no note adds none:": {[]discoveryv1.EndpointSlice{onNode("z", 1)}, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var got []string
			for _, nb := range FromNodesWithPods(over, tc.slices) {
				got = append(got, nb.Node)
			}
			assert.Equal(t, tc.want, got)
		})
	}
}
