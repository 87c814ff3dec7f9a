// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/status"
)

// staleSeries are the node labels of the swh_controller_agent_stale series in reg, sorted.
func staleSeries(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var nodes []string
	for _, mf := range mfs {
		if mf.GetName() != "swh_controller_agent_stale" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "node" {
					nodes = append(nodes, l.GetValue())
				}
			}
		}
	}
	slices.Sort(nodes)
	return nodes
}

// TestLeasesOfDeletedNodesCountForNothing is issue 17 part 3 against a real API server. Six
// nodes with an agent each; three agents stop and turn stale (3 of 6: not more than half, so
// they are withdrawn) and their Node objects are deleted, their Leases left behind (envtest
// runs no garbage collector, which would remove them with their Nodes). The controller forgets
// them: three agents known, none stale, and their swh_controller_agent_stale series are gone.
// Then one of the three remaining agents stops. Counting the dead Leases, 4 of 6 would look
// stale and the guard would hold for good; counting live nodes, 1 of 3 is stale, its endpoints
// are withdrawn after the grace, and the guard's metric and condition stay clear.
func TestLeasesOfDeletedNodesCountForNothing(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "lifecycle")
	reg := prometheus.NewRegistry()
	const grace = 4 * time.Second
	startController(t, ns, func(o *Options) {
		o.AgentLeaseNamespace = ns
		o.AgentLostGrace = grace
		o.Registry = reg
	})
	web := newResource(ns, "web", func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Ports = s.Spec.Ports[:1] })
	create(t, web)
	var names []string
	nodes := map[string]*corev1.Node{}
	sliceOf := map[string]*discoveryv1.EndpointSlice{}
	stop := map[string]func(){}
	for _, n := range []string{"n1", "n2", "n3", "n4", "n5", "n6"} {
		name := ns + "-" + n
		names = append(names, name)
		nodes[name] = node(t, name)
		sliceOf[name] = slice(t, ns, "web", web.UID, "http", name)
		stop[name] = renewLease(t, ns, name)
	}
	live, gone := names[:3], names[3:]
	require.Eventually(t, func() bool { return gauge(t, reg, "swh_controller_agents_known") == 6 }, wait, tick, "the controller sees six agents")

	// Three agents stop with their nodes: stale after the grace, then their Nodes go.
	for _, n := range gone {
		stop[n]()
	}
	require.Eventually(t, func() bool { return slices.Equal(staleSeries(t, reg), gone) }, 3*grace, tick,
		"the three silent agents are judged stale, each with its series")
	assert.Equal(t, 0.0, gauge(t, reg, "swh_controller_liveness_guard_holding"), "3 of 6 is not more than half")
	for _, n := range gone {
		require.NoError(t, env.Client.Delete(t.Context(), nodes[n]))
	}
	require.Eventually(t, func() bool {
		return gauge(t, reg, "swh_controller_agents_known") == 3 && gauge(t, reg, "swh_controller_agents_stale") == 0
	}, wait, tick, "the Leases of deleted nodes are ignored: three agents known, none stale")
	assert.Empty(t, staleSeries(t, reg), "the deleted nodes' stale series are removed")
	for _, n := range gone {
		var l coordinationv1.Lease
		require.NoError(t, env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: wellknown.AgentLeaseName(n)}, &l),
			"the Lease of %s is left behind", n)
	}

	// One of the three live agents stops: 1 of 3 is stale, and it is withdrawn.
	stop[live[0]]()
	require.Eventually(t, func() bool { return !endpointReady(t, sliceOf[live[0]]) }, 3*grace, tick,
		"the stale node's endpoint is withdrawn after the grace")
	assert.Equal(t, []string{live[0]}, staleSeries(t, reg))
	assert.Equal(t, 3.0, gauge(t, reg, "swh_controller_agents_known"))
	assert.Equal(t, 1.0, gauge(t, reg, "swh_controller_agents_stale"))
	assert.Equal(t, 0.0, gauge(t, reg, "swh_controller_liveness_guard_holding"), "the guard's metric stays clear")
	for _, n := range live[1:] {
		assert.True(t, endpointReady(t, sliceOf[n]), "the live agents' endpoints stay")
	}
	eventually(t, web, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		cond := condition(swh, v1alpha1.ConditionAgentsStale)
		assert.Equal(c, status.ReasonEndpointsWithdrawn, cond.Reason, "the guard's condition stays clear: %s", cond.Message)
		assert.Contains(c, cond.Message, "node "+live[0]+" ")
	}, "the resource says its endpoints on the stale node are withdrawn, not held")
}
