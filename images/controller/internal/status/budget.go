// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package status

import (
	"fmt"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// Reasons of the ProbeBudgetExceeded condition.
const (
	// ReasonTargetsOverBudget: agents report targets of the resource beyond their probe budget.
	ReasonTargetsOverBudget = "TargetsOverBudget"
	// ReasonWithinBudget: no agent reports the resource over its probe budget.
	ReasonWithinBudget = "WithinBudget"
)

// NodeBudget is one agent's report of the resource over its probe budget (development/AGENT.md,
// "Probe budget").
type NodeBudget struct {
	Node string
	// Budget is the agent's --max-probe-targets.
	Budget int
	// Asked is how many targets (pod × probe) the resource has on the node, Allowed how many
	// are probed.
	Asked, Allowed int
}

// FromNodesWithPods keeps the reports of the nodes where the resource has pods: a node with an
// endpoint in sliceList (the resource's slices as the audit verified them, so an endpoint
// naming no real Pod of the node does not count). A node's budget note about a resource it has
// no pod of is not believed: it would set ProbeBudgetExceeded on any resource of any namespace.
func FromNodesWithPods(over []NodeBudget, sliceList []discoveryv1.EndpointSlice) []NodeBudget {
	if len(over) == 0 {
		return nil
	}
	has := map[string]bool{}
	for i := range sliceList {
		if len(sliceList[i].Endpoints) > 0 {
			has[slicemeta.NodeOf(&sliceList[i])] = true
		}
	}
	var out []NodeBudget
	for _, nb := range over {
		if has[nb.Node] {
			out = append(out, nb)
		}
	}
	return out
}

// probeBudget is the ProbeBudgetExceeded condition, or nil when it is to be left out: nothing
// over budget and the resource never was (the condition appears with the first report and
// stays, False, once the resource is within budget again).
func probeBudget(current []metav1.Condition, over []NodeBudget) *metav1.Condition {
	if len(over) == 0 {
		if meta.FindStatusCondition(current, v1alpha1.ConditionProbeBudgetExceeded) == nil {
			return nil
		}
		return &metav1.Condition{Type: v1alpha1.ConditionProbeBudgetExceeded, Status: metav1.ConditionFalse, Reason: ReasonWithinBudget,
			Message: "every probe target of this resource is within its node's probe budget"}
	}
	parts := make([]string, 0, min(len(over), maxNamedNodes))
	asked, allowed := 0, 0
	for i, nb := range over {
		asked += nb.Asked
		allowed += nb.Allowed
		if i < maxNamedNodes {
			parts = append(parts, fmt.Sprintf("node %s: %d of %d probed (budget %d per node)", nb.Node, nb.Allowed, nb.Asked, nb.Budget))
		}
	}
	where := strings.Join(parts, "; ")
	if len(over) > maxNamedNodes {
		where += fmt.Sprintf("; and %d more nodes", len(over)-maxNamedNodes)
	}
	return &metav1.Condition{Type: v1alpha1.ConditionProbeBudgetExceeded, Status: metav1.ConditionTrue, Reason: ReasonTargetsOverBudget,
		Message: fmt.Sprintf("%d of %d probe targets (pod × probe) on %d nodes are beyond the agents' probe budget, "+
			"this namespace's share of it: they are not probed and their ports are published not serving (%s). "+
			"Fewer pods or probes per node fit the budget; the module setting agent.maxProbeTargets raises it",
			asked-allowed, asked, len(over), where)}
}
