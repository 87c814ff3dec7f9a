// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import (
	"testing"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// record logs one line of figures per scenario (run with -v to see it): every request of the
// loop, the requests inside the scenario's window, and the failed ones of each. The figures in
// development/BENCHMARKS-HISTORY.md ("End-to-end: zero-failure scenarios") are collected from these lines.
func record(t *testing.T, scenario string, all, window cluster.Results) {
	t.Helper()
	t.Logf("FIGURES scenario=%q requests=%d failed=%d window_requests=%d window_failed=%d",
		scenario, len(all), len(all.Failed()), len(window), len(window.Failed()))
}
