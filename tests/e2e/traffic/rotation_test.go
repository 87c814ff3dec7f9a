// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// chunkName is the name of chunk k of resource swh's port http on node: a name of that node's
// own, which the agent's policy lets its agent write.
func chunkName(swh *v1alpha1.ServiceWithHealthchecks, node string, k int) string {
	return slicemeta.SliceKey{Resource: swh.Name, Port: "http", Node: node, Chunk: k}.Name()
}

// nodeForgeryEvents are the controller's ForgedEndpointSlice Events about Node node (any
// namespace) with the given action.
func nodeForgeryEvents(t *testing.T, c *cluster.Cluster, node, action string) []eventsv1.Event {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, c.Env.Client.List(t.Context(), &list))
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Reason == forgedEvent && e.Regarding.Kind == "Node" && e.Regarding.Name == node && e.Action == action {
			out = append(out, e)
		}
	}
	return out
}

// Issue 40 items 1 and 2, end to end: a compromised node outruns the audit neither by rotating
// names nor by rewriting its slice. As node-a's agent (its pod-bound token, the chart's RBAC
// and the agent's admission policies in force), with a request loop through the real kube-proxy:
//
//   - rotation: the forged slice is deleted by the forger 0.9 s after each write (before the
//     1.5 s window closes) and written again under the other of two of node-a's chunk names;
//     the controller confirms it all the same and deletes it, with an Event on the Node; written
//     once more under a third name it is deleted again (a remembered forgery, no new window);
//   - churn: a second forged address in a slice whose annotation the forger rewrites every
//     second is deleted too.
//
// After each removal no request reaches the forged servers, both honest pods serve and no
// request of the loop fails; the honest slices stay.
func TestRotatedAndChurnedForgeriesAreDeletedAndTheirTrafficStops(t *testing.T) {
	s := testStack(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "rotated")
	attackerNS := c.Env.CreateNamespaceForTest(t, "rotator")
	applyAgentAdmission(t, s)
	agent := agentOf(t, c, "node-a")

	pods, swh, honest := honestWeb(t, c, ns)
	rotator := c.AddPod(t, cluster.PodSpec{Namespace: attackerNS, Name: "rotator", Node: "node-a", ContainerPorts: webPorts})
	rotatorServer := rotator.ServeHTTP(t, 8080)
	churner := c.AddPod(t, cluster.PodSpec{Namespace: attackerNS, Name: "churner", Node: "node-a", ContainerPorts: webPorts})
	churnerServer := churner.ServeHTTP(t, 8080)
	w := watchSlices(t, c, ns)
	loop := c.Traffic(t, cluster.TrafficOptions{Service: ns + "/web", Port: 80, Duration: loopFor})
	logTimelineOnFailure(t, w, loop)
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)
	obj, err := pods[0].Object(t.Context())
	require.NoError(t, err)
	forgery := func(name, addr string) *discoveryv1.EndpointSlice {
		f := forgedSlice(swh, "node-a", pods[0], obj.UID, addr)
		f.Name = name
		return f
	}
	// The agent's policies are in force: the forged slice without its targetRef is refused.
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		bare := forgery(chunkName(swh, "node-a", 5), ip(rotator))
		bare.Endpoints[0].TargetRef = nil
		err := agent.Create(t.Context(), bare, client.DryRunAll)
		if assert.Error(ct, err) {
			assert.True(ct, apierrors.IsForbidden(err), "%v", err)
		}
	}, waitFor, poll, "the agent's admission policies are in force")

	// Rotation between chunks 5 and 6 of node-a until the controller deletes one itself.
	written := time.Now()
	rotations := 0
	for k := 0; ; k++ {
		require.True(t, time.Since(written) < waitFor, "the rotated forgery is deleted (%d rotations so far)", rotations)
		f := forgery(chunkName(swh, "node-a", 5+k%2), ip(rotator))
		require.NoError(t, agent.Create(t.Context(), f), "admission admits the forged slice")
		deadline := time.Now().Add(900 * time.Millisecond)
		for time.Now().Before(deadline) && !isGone(t, c, f) {
			time.Sleep(10 * time.Millisecond)
		}
		if err := agent.Delete(t.Context(), f); apierrors.IsNotFound(err) {
			break // The controller deleted it first.
		} else {
			require.NoError(t, err)
		}
		rotations++
	}
	removed := time.Now()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.NotEmpty(ct, nodeForgeryEvents(t, c, "node-a", "ConfirmForgery"), "an Event on Node node-a")
	}, waitFor, poll, "the controller reports the node")
	waitNoMoreHits(t, loop, rotatorServer)

	// The same forgery once more, under a third name: deleted as a remembered forgery.
	again := forgery(chunkName(swh, "node-a", 7), ip(rotator))
	require.NoError(t, agent.Create(t.Context(), again))
	require.EventuallyWithT(t, func(ct *assert.CollectT) { assert.True(ct, isGone(t, c, again)) }, waitFor, poll,
		"the repeated forgery is deleted")
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.NotEmpty(ct, nodeForgeryEvents(t, c, "node-a", "DeleteRepeatedForgery"), "the repeat is reported on the Node")
	}, waitFor, poll, "the controller reports the repeat")

	// Churn: another address, its annotation rewritten every second.
	churned := forgery(chunkName(swh, "node-a", 8), ip(churner))
	require.NoError(t, agent.Create(t.Context(), churned))
	churnStart := time.Now()
	rewrites := 0
	for !isGone(t, c, churned) {
		require.True(t, time.Since(churnStart) < waitFor, "the churned forgery is deleted (%d rewrites so far)", rewrites)
		time.Sleep(time.Second)
		var cur discoveryv1.EndpointSlice
		if err := agent.Get(t.Context(), client.ObjectKeyFromObject(churned), &cur); err != nil {
			continue
		}
		metav1.SetMetaDataAnnotation(&cur.ObjectMeta, "churn", fmt.Sprint(rewrites))
		if agent.Update(t.Context(), &cur) == nil {
			rewrites++
		}
	}
	churnRemoved := time.Now()
	waitNoMoreHits(t, loop, churnerServer)

	quiet := time.Now()
	kit.WaitRequestsAfter(t, loop, quiet, 4*minInWindow)
	rotatorHits, churnerHits := rotatorServer.Hits(), churnerServer.Hits()
	kit.WaitRequestsAfter(t, loop, time.Now(), 2*minInWindow)
	res := loop.Stop()
	assert.Equal(t, rotatorHits, rotatorServer.Hits(), "no request reaches the rotated forgery's server after its removal")
	assert.Equal(t, churnerHits, churnerServer.Hits(), "no request reaches the churned forgery's server after its removal")
	after := res.Since(quiet)
	assert.ElementsMatch(t, []string{pods[0].Key(), pods[1].Key()}, after.Pods(), "both honest pods serve")
	assert.Empty(t, res.Failed(), "requests across the forgeries and their removal: %s; failed: %s", res, e2e.Failures(res))
	got, err := e2e.EndpointsOf(t.Context(), c, ns, "web")
	require.NoError(t, err)
	assert.Equal(t, honest, got, "the honest slices stay")
	var notes []string
	for _, e := range nodeForgeryEvents(t, c, "node-a", "ConfirmForgery") {
		notes = append(notes, e.Note)
	}
	assert.Contains(t, strings.Join(notes, "\n"), ip(rotator), "the Node's Event names the forged address")
	t.Logf("rotated forgery removed %s after its first write (%d rotations); churned forgery removed %s after its write (%d rewrites); the servers answered %d and %d requests; %d requests, %d failed",
		removed.Sub(written).Round(time.Millisecond), rotations, churnRemoved.Sub(churnStart).Round(time.Millisecond), rewrites,
		rotatorHits, churnerHits, len(res), len(res.Failed()))
}

// isGone tells whether slice s no longer exists.
func isGone(t *testing.T, c *cluster.Cluster, s *discoveryv1.EndpointSlice) bool {
	t.Helper()
	err := c.Env.Client.Get(context.WithoutCancel(t.Context()), client.ObjectKeyFromObject(s), &discoveryv1.EndpointSlice{})
	return apierrors.IsNotFound(err)
}

// waitNoMoreHits waits until a batch of the loop's requests passes without a hit on server.
func waitNoMoreHits(t *testing.T, loop *cluster.Traffic, server interface{ Hits() int64 }) {
	t.Helper()
	settled := server.Hits()
	for deadline := time.Now().Add(waitFor); ; {
		kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)
		now := server.Hits()
		if now == settled {
			return
		}
		settled = now
		require.True(t, time.Now().Before(deadline), "requests stop reaching the forged server (%d so far)", now)
	}
}

// Issue 40 item 4, end to end: what no agent plan produces is removed and never counted. As
// node-a's agent (the chart's RBAC and the agent's admission policies in force): a chunk of 1,000
// not-ready endpoints naming Pods of the namespace that do not exist (admitted: a policy cannot
// tell whether a Pod exists) and an empty chunk. The controller removes both with the Events
// naming the node; while they exist, the resource's status counts only its two real pods and
// lists no made-up one in notReady. The honest slices stay and serve.
func TestExhaustingSlicesOfANodeAreRemovedAndNeverCounted(t *testing.T) {
	s := testStack(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "exhaust")
	applyAgentAdmission(t, s)
	agent := agentOf(t, c, "node-a")
	pods, swh, honest := honestWeb(t, c, ns)

	flood := forgedSlice(swh, "node-a", pods[0], "x", "10.0.0.1")
	flood.Name = chunkName(swh, "node-a", 9)
	template := flood.Endpoints[0]
	flood.Endpoints = nil
	for i := range 1000 {
		e := *template.DeepCopy()
		e.Addresses = []string{fmt.Sprintf("10.250.%d.%d", i/250, i%250+1)}
		e.TargetRef.Name, e.TargetRef.UID = fmt.Sprintf("aaa-ghost-%04d", i), "00000000-0000-0000-0000-000000000000"
		no := false
		e.Conditions.Ready, e.Conditions.Serving = &no, &no
		flood.Endpoints = append(flood.Endpoints, e)
	}
	empty := forgedSlice(swh, "node-a", pods[0], "x", "10.0.0.1")
	empty.Name = chunkName(swh, "node-a", 10)
	empty.Endpoints = []discoveryv1.Endpoint{}
	// The agent's policies are in force: the flood's first endpoint without its targetRef is refused.
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		bare := flood.DeepCopy()
		bare.Endpoints = bare.Endpoints[:1]
		bare.Endpoints[0].TargetRef = nil
		err := agent.Create(t.Context(), bare, client.DryRunAll)
		if assert.Error(ct, err) {
			assert.True(ct, apierrors.IsForbidden(err), "%v", err)
		}
	}, waitFor, poll, "the agent's admission policies are in force")
	written := time.Now()
	require.NoError(t, agent.Create(t.Context(), flood), "admission admits the flood of not-ready ghosts")
	// An empty chunk is refused or undone: the agent's policy refuses it (a rule of its own: the
	// agent writes no slice without endpoints); were it admitted, the audit must remove it.
	emptyAdmitted := true
	if err := agent.Create(t.Context(), empty); err != nil {
		require.Contains(t, err.Error(), "service-with-healthchecks-agent-endpointslices", "refused by the agent's policy")
		t.Logf("the empty chunk is refused at admission: %v", err)
		emptyAdmitted = false
	}

	// While they exist, the status never counts them.
	for !isGone(t, c, flood) || !isGone(t, c, empty) {
		var cur v1alpha1.ServiceWithHealthchecks
		require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(swh), &cur))
		for _, p := range cur.Status.Ports {
			assert.LessOrEqual(t, p.TotalEndpoints, int32(2), "only the two real pods are counted")
			for _, nr := range p.NotReady {
				assert.NotContains(t, nr.Pod, "ghost", "no made-up pod is listed")
			}
		}
		require.Less(t, time.Since(written), waitFor, "the slices are removed")
		time.Sleep(poll)
	}
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		var notes []string
		for _, e := range nodeForgeryEvents(t, c, "node-a", "ConfirmForgery") {
			notes = append(notes, e.Note)
		}
		all := strings.Join(notes, "\n")
		assert.Contains(ct, all, "not-ready endpoint: pod aaa-ghost-", "the flood is reported on the Node")
		if emptyAdmitted {
			assert.Contains(ct, all, "the slice has no endpoints", "the empty chunk is reported on the Node")
		}
	}, waitFor, poll, "the controller reports the node")
	t.Logf("the flood (and an admitted empty chunk) removed %s after the write", time.Since(written).Round(time.Millisecond))
	got, err := e2e.EndpointsOf(t.Context(), c, ns, "web")
	require.NoError(t, err)
	assert.Equal(t, honest, got, "the honest slices stay")
	c.WaitProgrammed(t, ns+"/web", 80, pods...)
}
