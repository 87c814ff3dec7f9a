// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// TestPortEndpointGaugesFollowTheStatus: swh_controller_port_ready_endpoints and
// swh_controller_port_endpoints show each port's counts of the computed status, follow an
// endpoint going not ready, drop a removed port's series and every series of a deleted resource.
func TestPortEndpointGaugesFollowTheStatus(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "portmetrics")
	run := startController(t, ns, nil)
	swh := newResource(ns, "web", nil)
	create(t, swh)
	n1 := ns + "-n1"
	node(t, n1)
	http1 := slice(t, ns, "web", swh.UID, "http", n1, secondEndpoint)
	slice(t, ns, "web", swh.UID, "metrics", n1)

	ready := func(port string) float64 {
		return testutil.ToFloat64(run.metrics.PortReadyEndpoints.WithLabelValues(ns, "web", port))
	}
	total := func(port string) float64 {
		return testutil.ToFloat64(run.metrics.PortEndpoints.WithLabelValues(ns, "web", port))
	}
	series := func() int {
		return testutil.CollectAndCount(run.metrics.PortReadyEndpoints) + testutil.CollectAndCount(run.metrics.PortEndpoints)
	}
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.Equal(c, "http 2/2, metrics 1/1", swh.Status.ReadySummary)
	}, "the status counts every endpoint")
	assert.InDelta(t, 2, ready("http"), 0)
	assert.InDelta(t, 2, total("http"), 0)
	assert.InDelta(t, 1, ready("metrics"), 0)
	assert.InDelta(t, 1, total("metrics"), 0)

	// One http endpoint goes not ready: the ready gauge drops, the total stays.
	setReady(t, http1, "10.1.0.6", false)
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.Equal(c, "http 1/2, metrics 1/1", swh.Status.ReadySummary)
	}, "the status sees the endpoint go not ready")
	assert.InDelta(t, 1, ready("http"), 0)
	assert.InDelta(t, 2, total("http"), 0)

	// The metrics port is removed from the resource: its series go, http's stay.
	update(t, swh, func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Ports = s.Spec.Ports[:1] })
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.Len(c, swh.Status.Ports, 1)
	}, "the status has one port left")
	require.Equal(t, 2, series(), "one ready and one total series: the removed port's are deleted")
	assert.InDelta(t, 1, ready("http"), 0)

	// The resource is deleted: all of its series go.
	require.NoError(t, env.Client.Delete(t.Context(), swh))
	require.Eventually(t, func() bool { return series() == 0 }, wait, tick, "a deleted resource leaves no series")
}
