// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import (
	"context"
	"time"

	"github.com/deckhouse/service-with-healthchecks/testkit/metrics"
)

// scrapeSum reads a program's /metrics on addr and sums every sample of the metric name (all
// label sets; 0 when it has none).
func scrapeSum(ctx context.Context, addr, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	fams, err := metrics.Get(ctx, addr)
	if err != nil {
		return 0, err
	}
	return fams.Sum(name, nil), nil
}
