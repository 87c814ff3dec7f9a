// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"

	"github.com/deckhouse/service-with-healthchecks/testkit/metrics"
)

// agentMetrics scrapes the agent's metrics.
func agentMetrics(ctx context.Context, b *bench) (metrics.Families, error) {
	return metrics.Get(ctx, b.agentMetrics)
}
