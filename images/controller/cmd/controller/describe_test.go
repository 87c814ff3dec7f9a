// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/controller"
	"github.com/deckhouse/service-with-healthchecks/lib/metricsdesc"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

// TestDescribeMetricsListsWhatTheManagerRegisters: the manager the program runs (against a real
// API server, with the liveness runner) registers exactly the collectors describe-metrics lists.
func TestDescribeMetricsListsWhatTheManagerRegisters(t *testing.T) {
	env := controlplane.StartForTest(t, controlplane.Options{})
	fromManager := &metricsdesc.Recorder{}
	_, _, err := controller.NewManager(env.Config, controller.Options{
		MetricsBindAddress:     "0",
		HealthProbeBindAddress: "0",
		AgentLeaseNamespace:    "d8-service-with-healthchecks",
		Registry:               fromManager,
		SkipNameValidation:     true,
		Logger:                 logr.Discard(),
	})
	require.NoError(t, err)
	want, err := fromManager.Descriptions()
	require.NoError(t, err)
	require.NotEmpty(t, want)

	listed := &metricsdesc.Recorder{}
	require.NoError(t, recordMetrics(listed))
	got, err := listed.Descriptions()
	require.NoError(t, err)
	assert.Equal(t, want, got)
}

// TestDescribeMetricsCommandPrintsOneLinePerMetric runs the program's hidden command.
func TestDescribeMetricsCommandPrintsOneLinePerMetric(t *testing.T) {
	cmd := program(t, describeMetricsCommand)
	var out bytes.Buffer
	cmd.Stdout = &out
	require.NoError(t, cmd.Run())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	names := map[string]string{}
	for _, l := range lines {
		f := strings.Split(l, "\t")
		require.Len(t, f, 4, "name, type, labels, help: %q", l)
		names[f[0]] = f[1] + " " + f[2]
	}
	assert.Equal(t, "gauge namespace,name,port", names["swh_controller_port_ready_endpoints"])
	assert.Equal(t, "gauge node", names["swh_controller_agent_stale"])
	assert.Equal(t, "counter result", names["swh_controller_reconciles_total"])
	assert.Equal(t, "histogram -", names["swh_controller_reconcile_duration_seconds"])
	assert.Equal(t, "gauge -", names["swh_controller_liveness_guard_holding"])
}
