// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package liveness

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/ptr"
)

// TestStaleNodeGaugeNamesTheStaleNodesOnly: swh_controller_agent_stale{node} shows exactly the
// nodes judged stale (against the real API server, through a real withdrawal), and a node whose
// agent renews again leaves the gauge.
func TestStaleNodeGaugeNamesTheStaleNodesOnly(t *testing.T) {
	w := newWorld(t, "wd-m1", "wd-m2", "wd-m3")
	gauge := w.metrics.StaleNodes.Collector()
	assert.Equal(t, 0, testutil.CollectAndCount(gauge), "no node is stale before the grace")

	w.passGrace("wd-m2", "wd-m3")
	_, err := w.w.Run(t.Context())
	require.NoError(t, err)
	require.Equal(t, ptr.To(false), w.get(t, "wd-m1").Endpoints[0].Conditions.Ready, "the stale node's endpoints were withdrawn")
	require.NoError(t, testutil.CollectAndCompare(gauge, strings.NewReader(`
# HELP swh_controller_agent_stale 1 for every node whose agent's Lease renewTime has not changed for longer than the grace (its endpoints are withdrawn unless the liveness guard holds), by node.
# TYPE swh_controller_agent_stale gauge
swh_controller_agent_stale{node="wd-m1"} 1
`)))

	// The agent of wd-m1 renews again: it leaves the gauge; wd-m2 falls silent and enters it.
	w.tracker.Observe("wd-m1", time.Unix(3, 0))
	w.tracker.Observe("wd-m3", time.Unix(3, 0))
	w.clock.Step(30 * time.Second) // wd-m2 has been silent for 41 s, the others for 30 s
	w.caughtUp(t, "wd-m1")
	_, err = w.w.Run(t.Context())
	require.NoError(t, err)
	require.NoError(t, testutil.CollectAndCompare(gauge, strings.NewReader(`
# HELP swh_controller_agent_stale 1 for every node whose agent's Lease renewTime has not changed for longer than the grace (its endpoints are withdrawn unless the liveness guard holds), by node.
# TYPE swh_controller_agent_stale gauge
swh_controller_agent_stale{node="wd-m2"} 1
`)))
}
