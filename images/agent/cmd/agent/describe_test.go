// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/lib/metricsdesc"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

// TestDescribeMetricsListsWhatTheAgentRegisters: the agent the program runs (built against a
// real API server) registers exactly the collectors describe-metrics lists.
func TestDescribeMetricsListsWhatTheAgentRegisters(t *testing.T) {
	env := controlplane.StartForTest(t, controlplane.Options{})
	fromAgent := &metricsdesc.Recorder{}
	_, err := agent.New(agent.Options{
		NodeName:               "describe",
		Config:                 env.Config,
		MetricsBindAddress:     "0",
		HealthProbeBindAddress: "0",
		Registry:               fromAgent,
		Logger:                 logr.Discard(),
	})
	require.NoError(t, err)
	want, err := fromAgent.Descriptions()
	require.NoError(t, err)
	require.NotEmpty(t, want)

	listed := &metricsdesc.Recorder{}
	recordMetrics(listed)
	got, err := listed.Descriptions()
	require.NoError(t, err)
	assert.Equal(t, want, got)
}

// TestDescribeMetricsCommandPrintsOneLinePerMetric runs the program's hidden command.
func TestDescribeMetricsCommandPrintsOneLinePerMetric(t *testing.T) {
	cmd := exec.CommandContext(t.Context(), os.Args[0], describeMetricsCommand)
	cmd.Env = append(os.Environ(), "SWH_AGENT_RUN_MAIN=1")
	var out bytes.Buffer
	cmd.Stdout = &out
	require.NoError(t, cmd.Run())
	names := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		f := strings.Split(l, "\t")
		require.Len(t, f, 4, "name, type, labels, help: %q", l)
		names[f[0]] = f[1] + " " + f[2]
	}
	assert.Equal(t, "gauge problem", names["swh_agent_credential_secret_problems"])
	assert.Equal(t, "histogram mode,outcome", names["swh_agent_probe_duration_seconds"])
	assert.Equal(t, "counter mode,outcome", names["swh_agent_probe_results_total"])
	assert.Equal(t, "gauge -", names["swh_agent_probe_targets"])
	assert.Equal(t, "gauge -", names["swh_agent_lease_last_renew_timestamp_seconds"])
}
