// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package status

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

func sliceOn(node string) discoveryv1.EndpointSlice {
	key := slicemeta.SliceKey{Resource: "web", Port: "http", Node: node}
	return discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: key.Name(), Labels: key.Labels(), Annotations: key.Annotations()}}
}

func TestAgentsStale(t *testing.T) {
	many := make([]string, 7)
	for i := range many {
		many[i] = fmt.Sprintf("n%d", i)
	}
	manySlices := make([]discoveryv1.EndpointSlice, 0, len(many))
	for _, n := range many {
		manySlices = append(manySlices, sliceOn(n))
	}
	tests := map[string]struct {
		agents     *Agents
		slices     []discoveryv1.EndpointSlice
		status     metav1.ConditionStatus
		reason     string
		contains   []string
		notContain []string
	}{
		"no stale agent": {
			agents: &Agents{Known: 2}, slices: []discoveryv1.EndpointSlice{sliceOn("a")},
			status: metav1.ConditionFalse, reason: ReasonAgentsFresh,
		},
		"a stale agent on a node without endpoints of the resource does not count": {
			agents: &Agents{Known: 3, Stale: []string{"c"}}, slices: []discoveryv1.EndpointSlice{sliceOn("a"), sliceOn("b")},
			status: metav1.ConditionFalse, reason: ReasonAgentsFresh,
		},
		"the guard holding does not concern a resource whose agents are live": {
			agents: &Agents{Known: 3, Stale: []string{"b", "c"}, Guarded: true}, slices: []discoveryv1.EndpointSlice{sliceOn("a")},
			status: metav1.ConditionFalse, reason: ReasonAgentsFresh,
		},
		"a stale agent with endpoints of the resource: withdrawn": {
			agents: &Agents{Known: 3, Stale: []string{"b"}, LeaseNamespace: "d8-swh"}, slices: []discoveryv1.EndpointSlice{sliceOn("a"), sliceOn("b")},
			status: metav1.ConditionTrue, reason: ReasonEndpointsWithdrawn,
			contains:   []string{"the agent of node b has not renewed its Lease", "withdrawn (ready=false, serving=false)", "swh-agent-<node> in namespace d8-swh"},
			notContain: []string{"node a"},
		},
		"two stale agents are named in the plural": {
			agents: &Agents{Known: 5, Stale: []string{"a", "b"}}, slices: []discoveryv1.EndpointSlice{sliceOn("a"), sliceOn("b")},
			status: metav1.ConditionTrue, reason: ReasonEndpointsWithdrawn,
			contains: []string{"the agents of nodes a, b have not renewed their Leases"},
		},
		"the guard holds: nothing withdrawn, and the message says what to check": {
			agents: &Agents{Known: 3, Stale: []string{"b", "c"}, Guarded: true, LeaseNamespace: "d8-swh"}, slices: []discoveryv1.EndpointSlice{sliceOn("a"), sliceOn("b")},
			status: metav1.ConditionTrue, reason: ReasonWithdrawalHeld,
			contains:   []string{"2 of 3 agents look stale at once", "withdraws nothing", "on node b stay", "API server", "connectivity", "swh-agent-<node> in namespace d8-swh"},
			notContain: []string{"node c", "nodes"},
		},
		"the guard counts the agents that look stale, not only those past the grace": {
			agents: &Agents{Known: 4, Stale: []string{"b"}, LookStale: 3, Guarded: true}, slices: []discoveryv1.EndpointSlice{sliceOn("b")},
			status: metav1.ConditionTrue, reason: ReasonWithdrawalHeld,
			contains: []string{"3 of 4 agents look stale at once", "on node b stay"},
		},
		"many nodes are named up to a bound": {
			agents: &Agents{Known: 9, Stale: many, Guarded: true}, slices: manySlices,
			status: metav1.ConditionTrue, reason: ReasonWithdrawalHeld,
			contains:   []string{"7 of 9 agents", "nodes n0, n1, n2, n3, n4 and 2 more"},
			notContain: []string{"n5", "n6"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			swh := &v1alpha1.ServiceWithHealthchecks{ObjectMeta: metav1.ObjectMeta{Name: "web", Generation: 2}}
			st := Compute(Observed{Resource: swh, ServiceSynced: metav1.Condition{Status: metav1.ConditionTrue, Reason: "Synced"}, Slices: tc.slices, Agents: tc.agents})
			c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionAgentsStale)
			require.NotNil(t, c)
			assert.Equal(t, tc.status, c.Status)
			assert.Equal(t, tc.reason, c.Reason)
			assert.Equal(t, int64(2), c.ObservedGeneration)
			for _, s := range tc.contains {
				assert.Contains(t, c.Message, s)
			}
			for _, s := range tc.notContain {
				assert.NotContains(t, c.Message, s)
			}
		})
	}
}

func TestAgentsStaleIsLeftAloneWhenAgentsAreNotJudged(t *testing.T) {
	before := metav1.Condition{Type: v1alpha1.ConditionAgentsStale, Status: metav1.ConditionTrue, Reason: ReasonWithdrawalHeld, Message: "kept"}
	swh := &v1alpha1.ServiceWithHealthchecks{Status: v1alpha1.ServiceWithHealthchecksStatus{Conditions: []metav1.Condition{before}}}
	st := Compute(Observed{Resource: swh, ServiceSynced: metav1.Condition{Status: metav1.ConditionTrue, Reason: "Synced"}, Slices: []discoveryv1.EndpointSlice{sliceOn("a")}})
	assert.Equal(t, &before, meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionAgentsStale))
}

func TestReadyDoesNotFollowAgentsStale(t *testing.T) {
	swh := &v1alpha1.ServiceWithHealthchecks{Spec: v1alpha1.ServiceWithHealthchecksSpec{Ports: []v1alpha1.ServicePort{{Name: "http", Port: 80}}}}
	s := sliceOn("a")
	s.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}}
	st := Compute(Observed{Resource: swh, ServiceSynced: metav1.Condition{Status: metav1.ConditionTrue, Reason: "Synced"},
		Slices: []discoveryv1.EndpointSlice{s}, Agents: &Agents{Known: 1, Stale: []string{"a"}, Guarded: true}})
	assert.Equal(t, metav1.ConditionTrue, meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionAgentsStale).Status)
	assert.Equal(t, metav1.ConditionTrue, meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady).Status)
}
