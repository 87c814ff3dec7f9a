// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// setReady sets the ready (and serving) condition of the endpoint with address addr, as the
// agent does when a pod's probe fails or recovers.
func setReady(t *testing.T, s *discoveryv1.EndpointSlice, addr string, ready bool) {
	t.Helper()
	update(t, s, func(s *discoveryv1.EndpointSlice) {
		for i := range s.Endpoints {
			if s.Endpoints[i].Addresses[0] == addr {
				s.Endpoints[i].Conditions.Ready = ptr.To(ready)
				s.Endpoints[i].Conditions.Serving = ptr.To(ready)
			}
		}
	})
}

func secondEndpoint(s *discoveryv1.EndpointSlice) {
	e := *s.Endpoints[0].DeepCopy()
	e.Addresses = []string{"10.1.0.6"}
	s.Endpoints = append(s.Endpoints, e)
}

// TestStatusFollowsTheSlices: per-port counts, the summary, EndpointsAvailable and Ready follow
// a pod going not ready and ready again; afterwards reconciles of the unchanged world write no
// status.
func TestStatusFollowsTheSlices(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "status")
	run := startController(t, ns, nil)
	swh := newResource(ns, "web", nil)
	create(t, swh)
	n1, n2 := ns+"-n1", ns+"-n2"
	node(t, n1)
	node(t, n2)
	http1 := slice(t, ns, "web", swh.UID, "http", n1, secondEndpoint)
	slice(t, ns, "web", swh.UID, "http", n2, func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Addresses = []string{"10.2.0.5"} })
	metrics1 := slice(t, ns, "web", swh.UID, "metrics", n1)

	all := []v1alpha1.PortStatus{
		{Name: "http", Port: 80, ReadyEndpoints: 3, TotalEndpoints: 3},
		{Name: "metrics", Port: 9090, ReadyEndpoints: 1, TotalEndpoints: 1},
	}
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.Equal(c, all, swh.Status.Ports)
		assert.Equal(c, "http 3/3, metrics 1/1", swh.Status.ReadySummary)
		assert.Equal(c, metav1.ConditionTrue, condition(swh, v1alpha1.ConditionEndpointsAvailable).Status)
		assert.Equal(c, metav1.ConditionTrue, condition(swh, v1alpha1.ConditionReady).Status)
		assert.Equal(c, metav1.ConditionFalse, condition(swh, v1alpha1.ConditionSliceNameConflict).Status)
	}, "every endpoint is counted and the resource is ready")

	// One pod of http fails: counts drop, the resource stays ready (another endpoint serves).
	setReady(t, http1, "10.1.0.6", false)
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.Equal(c, "http 2/3, metrics 1/1", swh.Status.ReadySummary)
		assert.Equal(c, metav1.ConditionTrue, condition(swh, v1alpha1.ConditionReady).Status)
	}, "a pod going not ready lowers the ready count")

	// The only pod of metrics fails: EndpointsAvailable and Ready turn False and name the port.
	setReady(t, metrics1, "10.1.0.5", false)
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.Equal(c, []v1alpha1.PortStatus{
			// The test's endpoints name no pod: counted out, not listed (notReady needs a targetRef).
			{Name: "http", Port: 80, ReadyEndpoints: 2, TotalEndpoints: 3, NotReadyOmitted: 1},
			{Name: "metrics", Port: 9090, ReadyEndpoints: 0, TotalEndpoints: 1, NotReadyOmitted: 1},
		}, swh.Status.Ports)
		available := condition(swh, v1alpha1.ConditionEndpointsAvailable)
		assert.Equal(c, metav1.ConditionFalse, available.Status)
		assert.Equal(c, "no ready endpoint for port metrics", available.Message)
		assert.Equal(c, metav1.ConditionFalse, condition(swh, v1alpha1.ConditionReady).Status)
	}, "a port without a ready endpoint makes the resource not ready")

	// Both recover.
	setReady(t, metrics1, "10.1.0.5", true)
	setReady(t, http1, "10.1.0.6", true)
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.Equal(c, all, swh.Status.Ports)
		assert.Equal(c, metav1.ConditionTrue, condition(swh, v1alpha1.ConditionEndpointsAvailable).Status)
		assert.Equal(c, metav1.ConditionTrue, condition(swh, v1alpha1.ConditionReady).Status)
	}, "the pods recovering make the resource ready again")

	// The world is unchanged now: reconciles run (forced by slice touches) but write no status.
	statusWrites := testutil.ToFloat64(run.metrics.StatusWrites)
	require.Positive(t, statusWrites, "the status was written while it changed")
	settled := false
	for i := 0; i < 20 && !settled; i++ {
		before, writes := run.reconciles(), testutil.ToFloat64(run.metrics.StatusWrites)
		touch(t, metrics1, "settle-"+strings.Repeat("x", i))
		require.Eventually(t, func() bool { return run.reconciles() > before }, wait, tick)
		settled = writes == testutil.ToFloat64(run.metrics.StatusWrites)
	}
	require.True(t, settled, "status writes stop once the world is unchanged")
	writes := testutil.ToFloat64(run.metrics.StatusWrites)
	for i := range 3 {
		before := run.reconciles()
		touch(t, metrics1, "steady-"+strings.Repeat("y", i))
		require.Eventually(t, func() bool { return run.reconciles() > before }, wait, tick, "touch %d is reconciled", i)
	}
	assert.Equal(t, writes, testutil.ToFloat64(run.metrics.StatusWrites), "reconciling an unchanged world writes no status")
}

// TestSliceNameConflictOnBothResources: "a-b" port "c" and "a" port "b-c" name their slices
// alike on every node; both report it, naming the other, and deleting one resolves it on the other.
func TestSliceNameConflictOnBothResources(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "conflict")
	startController(t, ns, nil)
	one := newResource(ns, "a-b", func(s *v1alpha1.ServiceWithHealthchecks) {
		s.Spec.Ports = s.Spec.Ports[:1]
		s.Spec.Ports[0].Name = "c"
	})
	create(t, one)
	eventually(t, one, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.Equal(c, metav1.ConditionFalse, condition(swh, v1alpha1.ConditionSliceNameConflict).Status)
	}, "alone, a-b has no conflict")

	two := newResource(ns, "a", func(s *v1alpha1.ServiceWithHealthchecks) {
		s.Spec.Ports = s.Spec.Ports[:1]
		s.Spec.Ports[0].Name = "b-c"
	})
	create(t, two)
	eventually(t, one, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		cond := condition(swh, v1alpha1.ConditionSliceNameConflict)
		assert.Equal(c, metav1.ConditionTrue, cond.Status)
		assert.Contains(c, cond.Message, "port c collides with resource a, port b-c")
	}, "a-b reports the conflict once a appears")
	eventually(t, two, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		cond := condition(swh, v1alpha1.ConditionSliceNameConflict)
		assert.Equal(c, metav1.ConditionTrue, cond.Status)
		assert.Contains(c, cond.Message, "port b-c collides with resource a-b, port c")
	}, "a reports the conflict too")

	require.NoError(t, env.Client.Delete(t.Context(), two))
	eventually(t, one, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.Equal(c, metav1.ConditionFalse, condition(swh, v1alpha1.ConditionSliceNameConflict).Status)
	}, "deleting a resolves the conflict on a-b")
}
