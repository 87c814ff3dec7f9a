// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"io"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/lib/metricsdesc"
)

// describeMetricsCommand is the hidden command that prints every metric the program registers
// (tests/monitoring and the docs/METRICS.md check run it; it is a command, not a flag, so --help
// and the frozen flags are unchanged).
const describeMetricsCommand = "describe-metrics"

// recordMetrics registers with rec every collector agent.New registers;
// TestDescribeMetricsListsWhatTheAgentRegisters keeps it in step. controller-runtime's own
// metrics (workqueue_*, rest_client_*, controller_runtime_*) go to its global registry and are
// not listed.
func recordMetrics(rec *metricsdesc.Recorder) {
	metrics.New(rec)
}

// describeMetrics prints the metrics of every collector the program registers, from Describe:
// one tab-separated line each (name, type, labels, help).
func describeMetrics(w io.Writer) error {
	rec := &metricsdesc.Recorder{}
	recordMetrics(rec)
	return rec.Write(w)
}
