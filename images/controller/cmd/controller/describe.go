// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"io"

	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/lib/metricsdesc"
)

// describeMetricsCommand is the hidden command that prints every metric the program registers
// (tests/monitoring and the docs/METRICS.md check run it; it is a command, not a flag, so --help
// and the frozen flags are unchanged).
const describeMetricsCommand = "describe-metrics"

// recordMetrics registers with rec every collector the manager registers (the controller's
// metrics, the liveness runner's among them); TestDescribeMetricsListsWhatTheManagerRegisters keeps it
// in step with controller.NewManager. controller-runtime's own metrics (workqueue_*,
// rest_client_*, leader_election_master_status, controller_runtime_*) go to its global
// registry and are not listed.
func recordMetrics(rec *metricsdesc.Recorder) error {
	_, err := metrics.New(rec)
	return err
}

// describeMetrics prints the metrics of every collector the program registers, from Describe:
// one tab-separated line each (name, type, labels, help).
func describeMetrics(w io.Writer) error {
	rec := &metricsdesc.Recorder{}
	if err := recordMetrics(rec); err != nil {
		return err
	}
	return rec.Write(w)
}
