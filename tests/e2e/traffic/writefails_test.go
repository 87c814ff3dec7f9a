// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/faults"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// selectorRefusal is the message of the admission policy that refuses clearing the adopted
// Service's selector.
const selectorRefusal = "the e2e test refuses every change of this Service's selector"

// holdFault is how long the fault is held once the controller has reported it: the
// assertions of the fault are checked at every poll in that time.
const holdFault = 5 * time.Second

// faultState reads, during the fault, what must not change: the resource's status.clusterIP,
// its ServiceSynced condition (False with the refusal), and the Service's selector (kept).
func faultState(ctx context.Context, ct assert.TestingT, c *cluster.Cluster, svc *corev1.Service, swh *v1alpha1.ServiceWithHealthchecks) {
	cur := &v1alpha1.ServiceWithHealthchecks{}
	if !assert.NoError(ct, c.Env.Client.Get(ctx, client.ObjectKeyFromObject(swh), cur)) {
		return
	}
	assert.Equal(ct, svc.Spec.ClusterIP, cur.Status.ClusterIP, "status.clusterIP stays the Service's: a failed write is no ownership change")
	cond := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionServiceSynced)
	if assert.NotNil(ct, cond, "ServiceSynced is set") {
		assert.Equal(ct, metav1.ConditionFalse, cond.Status, "ServiceSynced while the write is refused: %s: %s", cond.Reason, cond.Message)
		assert.Contains(ct, cond.Message, selectorRefusal, "the condition says why (reason %s)", cond.Reason)
	}
	got := &corev1.Service{}
	if assert.NoError(ct, c.Env.Client.Get(ctx, client.ObjectKeyFromObject(svc), got)) {
		assert.Equal(ct, svc.Spec.Selector, got.Spec.Selector, "the refused write did not happen")
		assert.Equal(ct, svc.Spec.ClusterIP, got.Spec.ClusterIP)
	}
}

// withdrawals keeps, from sliceWatch.ConditionChanges lines, those of the resource's own
// slices (by name) that withdraw an endpoint: removed, or changed to anything but ready
// ("TTF"). A late watch event of the publication itself ("added TTF", "FFF -> TTF") is none.
func withdrawals(lines []string, slices map[string]map[string]string) []string {
	var out []string
	for _, l := range lines {
		name, change, _ := strings.Cut(l, ": ")
		if _, ok := slices[name]; !ok || strings.HasSuffix(change, " added TTF") || strings.HasSuffix(change, " -> TTF") {
			continue
		}
		out = append(out, l)
	}
	return out
}

// Issue 28 part 3, end to end: a write error is not an ownership change. A live Service with
// two pods, under a request loop through the real kube-proxy, is adopted by a
// ServiceWithHealthchecks while a ValidatingAdmissionPolicy of the real API server refuses the
// controller's patch that clears its selector. While the fault lasts the resource's
// status.clusterIP stays the Service's, ServiceSynced is False with the refusal's message, no
// endpoint of the module's slices is withdrawn (the agents would withdraw every one on an
// empty status.clusterIP) and no request fails; once the policy is deleted the selector is
// cleared, ServiceSynced turns True and still no request has failed.
func TestWriteFailsWithdrawNoEndpointAndFailNoRequest(t *testing.T) {
	s := testStack(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "writefails")
	svc, pods, _ := migrationSetup(t, s, ns)
	require.NotEmpty(t, svc.Spec.ClusterIP)
	end := faults.RefuseSelectorChanges(t, c.Env.Client, ns, "web", selectorRefusal, waitFor, poll)

	w := watchSlices(t, c, ns)
	loop := c.Traffic(t, cluster.TrafficOptions{Service: ns + "/web", Port: 80, Duration: loopFor})
	logTimelineOnFailure(t, w, loop)
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)
	adopting := time.Now()
	swh := migratingResource(ns, svc.Spec.Selector)
	require.NoError(t, c.Env.Client.Create(t.Context(), swh))

	// The agents publish every port ready, so the controller clears the selector, and the API
	// server refuses it: the fault really happens when the condition carries the refusal.
	published := map[string]map[string]string{
		"web-http-node-a": {ip(pods[0]): "TTF"},
		"web-http-node-b": {ip(pods[1]): "TTF"},
	}
	kit.EventuallyEndpoints(t, c, ns, "web", published)
	ready := time.Now()
	require.EventuallyWithT(t, func(ct *assert.CollectT) { faultState(t.Context(), ct, c, svc, swh) },
		waitFor, poll, "the controller reports the refused write and keeps the Service")
	refused := time.Now()

	// Hold the fault: every poll, nothing that the fault must not change has changed.
	for until := time.Now().Add(holdFault); time.Now().Before(until); time.Sleep(poll) {
		faultState(t.Context(), t, c, svc, swh)
		if t.Failed() {
			t.FailNow()
		}
	}
	got, err := e2e.EndpointsOf(t.Context(), c, ns, "web")
	require.NoError(t, err)
	assert.Equal(t, published, got, "the module's slices at the end of the fault")
	faultEnd := time.Now()
	assert.Empty(t, withdrawals(w.ConditionChangesBefore(faultEnd)[len(w.ConditionChangesBefore(ready)):], published),
		"no endpoint of the module's slices is withdrawn during the fault")
	kit.WaitRequestsAfter(t, loop, faultEnd, minInWindow)
	during := kit.RequireWindow(t, loop.Results(), "the fault, from the slices ready to its end", ready, faultEnd)
	assert.Empty(t, during.Failed(), "requests during the fault: %s; failed: %s", during, e2e.Failures(during))

	// The fault ends: everything recovers.
	end()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		got := &corev1.Service{}
		require.NoError(ct, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(svc), got))
		assert.Empty(ct, got.Spec.Selector, "the selector is cleared")
		assert.Equal(ct, svc.Spec.ClusterIP, got.Spec.ClusterIP, "the ClusterIP is kept")
		cur := &v1alpha1.ServiceWithHealthchecks{}
		require.NoError(ct, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(swh), cur))
		assert.Equal(ct, svc.Spec.ClusterIP, cur.Status.ClusterIP)
		cond := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionServiceSynced)
		require.NotNil(ct, cond)
		assert.Equal(ct, metav1.ConditionTrue, cond.Status, "%s: %s", cond.Reason, cond.Message)
	}, waitFor, poll, "the selector is cleared and the resource synced once the fault ends")
	kit.EventuallyEndpoints(t, c, ns, "web", published)
	c.WaitProgrammed(t, ns+"/web", 80, pods...)
	recovered := time.Now()
	kit.WaitRequestsAfter(t, loop, recovered, minInWindow)
	res := loop.Stop()

	window := kit.RequireWindow(t, res, "the adoption under the fault, from the resource created to the recovery", adopting, recovered)
	assert.Empty(t, res.Failed(), "requests across the fault and the recovery: %s; failed: %s", res, e2e.Failures(res))
	assert.Empty(t, withdrawals(w.ConditionChanges()[len(w.ConditionChangesBefore(ready)):], published),
		"no endpoint of the module's slices is withdrawn from the slices ready to the end")
	assert.ElementsMatch(t, []string{pods[0].Key(), pods[1].Key()}, window.Pods(), "both pods answered")
	t.Logf("write fails: slices ready %s after the resource, refusal reported %s later, fault held %s, recovered %s after its end; %d requests in the window, %d failed; %d in the whole loop",
		ready.Sub(adopting).Round(time.Millisecond), refused.Sub(ready).Round(time.Millisecond), faultEnd.Sub(refused).Round(time.Millisecond),
		recovered.Sub(faultEnd).Round(time.Millisecond), len(window), len(window.Failed()), len(res))
}
