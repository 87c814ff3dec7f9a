// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package lease

import (
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
)

// TestRenewerMetricsCountFailuresAndStampRenewals: against the real API server, forbidden
// renewals count swh_agent_lease_renew_errors_total and leave the last-renewal time unset; once
// allowed, swh_agent_lease_last_renew_timestamp_seconds carries the time of a renewal.
func TestRenewerMetricsCountFailuresAndStampRenewals(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "lease")
	createNode(t, "worker-m")
	sa := "agent"
	c, err := env.ServiceAccountClient(ns, sa)
	require.NoError(t, err)
	m := metrics.New(nil)
	before := time.Now()
	run(t, &Renewer{Client: c, Namespace: ns, Node: "worker-m", Interval: 50 * time.Millisecond, Log: logr.Discard(), Metrics: m})

	require.Eventually(t, func() bool { return testutil.ToFloat64(m.LeaseRenewErrors) >= 2 }, 30*time.Second, 20*time.Millisecond,
		"forbidden renewals are counted")
	assert.Zero(t, testutil.ToFloat64(m.LeaseLastRenew), "no renewal has succeeded yet")

	grant(t, ns, sa)
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.LeaseLastRenew) > 0 }, 30*time.Second, 20*time.Millisecond,
		"a successful renewal stamps its time")
	_, err = getLease(t, ns, "worker-m")
	require.NoError(t, err, "the Lease exists once a renewal succeeded")
	stamp := testutil.ToFloat64(m.LeaseLastRenew)
	assert.GreaterOrEqual(t, stamp, float64(before.Unix()))
	assert.LessOrEqual(t, stamp, float64(time.Now().Unix()+1))
}
