// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package realnode_test

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/realnode"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// TestRealNodeGracefulTerminationWithPreStop: a pod deleted with a preStop sleep of 5 s is
// published serving and terminating (not ready) while the kubelet runs the hook, kube-proxy
// stops sending it new connections, and the request loop through the ClusterIP sees 0 failures.
func TestRealNodeGracefulTerminationWithPreStop(t *testing.T) {
	s, _ := realStack(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "prestop")
	d := deployment(ns, "1")
	spec := &d.Spec.Template.Spec
	spec.Containers[0].Args = []string{"-listen", ":8080,:8081"} // exits at once on SIGTERM
	spec.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 5}}}
	require.NoError(t, s.Apply(t.Context(), ns, webResource(ns), d))
	pods := waitPods(t, c, ns, "1", 2)
	waitProgrammed(t, c, ns+"/web", 80, endpoints(pods, 8080))

	loop := webTraffic(t, c, ns)
	from := time.Now()
	gone := pods[0]
	require.NoError(t, c.Env.Client.Delete(t.Context(), &gone))
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		eps, err := e2e.EndpointsOf(t.Context(), c, ns, "web")
		require.NoError(ct, err)
		var seen []string
		for _, slice := range eps {
			if conds, ok := slice[gone.Status.PodIP]; ok {
				seen = append(seen, conds)
			}
		}
		assert.Contains(ct, seen, "FTT", "the terminating pod is published serving, terminating, not ready")
	}, tm.WaitFor, 50*time.Millisecond)
	waitProgrammed(t, c, ns+"/web", 80, endpoints(pods[1:], 8080))
	require.Eventually(t, func() bool {
		var p corev1.Pod
		return apierrors.IsNotFound(c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(&gone), &p))
	}, tm.WaitFor, tm.Poll, "the kubelet did not finish the pod's termination")
	to := time.Now()
	tm.WaitRequestsAfter(t, loop, to, tm.MinInWindow)
	res := loop.Stop()

	tm.RequireWindow(t, res, "graceful termination", from, to)
	require.Empty(t, res.Failed(), "failed requests: %s", e2e.Failures(res))
}

// TestRealNodeContainerRestartKeepsThePodIP: the container crashes (exit status 3); the kubelet
// restarts it in the same sandbox, so the pod keeps its IP, and the product's probes go on
// against it: the endpoint is routed again and the restarted container answers.
func TestRealNodeContainerRestartKeepsThePodIP(t *testing.T) {
	s, _ := realStack(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "restart")
	require.NoError(t, s.Apply(t.Context(), ns, webResource(ns), deployment(ns, "1")))
	pods := waitPods(t, c, ns, "1", 2)
	waitProgrammed(t, c, ns+"/web", 80, endpoints(pods, 8080))

	crashed := pods[0]
	control(t, crashed.Status.PodIP, "exit")
	var after corev1.Pod
	require.Eventually(t, func() bool {
		if err := c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(&crashed), &after); err != nil {
			return false
		}
		st := after.Status.ContainerStatuses
		return len(st) == 1 && st[0].RestartCount >= 1 && podReady(&after)
	}, tm.WaitFor, tm.Poll, "the kubelet did not restart the container")
	require.Equal(t, crashed.UID, after.UID, "the same pod")
	require.Equal(t, crashed.Status.PodIP, after.Status.PodIP, "a restarted container keeps its pod's IP")
	require.NotNil(t, after.Status.ContainerStatuses[0].LastTerminationState.Terminated)
	require.Equal(t, int32(3), after.Status.ContainerStatuses[0].LastTerminationState.Terminated.ExitCode)
	waitProgrammed(t, c, ns+"/web", 80, endpoints(pods, 8080))
	status, who, err := get(t.Context(), "http://"+net.JoinHostPort(after.Status.PodIP, "8080")+"/")
	require.NoError(t, err)
	require.Equal(t, 200, status)
	require.Equal(t, ns+"/"+crashed.Name, who)
	res := c.Requests(t, cluster.TrafficOptions{Service: ns + "/web", Port: 80, Count: 40})
	require.Empty(t, res.Failed(), "failed requests after the restart: %s", e2e.Failures(res))
}

// TestRealNodeKubeletStopped: the kubelet stops on the node (its containers keep running, as
// when a kubelet dies): the agent's view does not change, the pods stay published and routed
// with 0 failed requests; the kubelet starts again and the Node is Ready again.
func TestRealNodeKubeletStopped(t *testing.T) {
	s, node := realStack(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "kubelet")
	require.NoError(t, s.Apply(t.Context(), ns, webResource(ns), deployment(ns, "1")))
	pods := waitPods(t, c, ns, "1", 2)
	waitProgrammed(t, c, ns+"/web", 80, endpoints(pods, 8080))
	before, err := e2e.EndpointsOf(t.Context(), c, ns, "web")
	require.NoError(t, err)

	loop := webTraffic(t, c, ns)
	from := time.Now()
	require.NoError(t, node.StopKubelet())
	require.Zero(t, node.KubeletPID())
	// The agent's probes keep running for a window of requests with the kubelet gone.
	tm.WaitRequestsAfter(t, loop, from, 5*tm.MinInWindow)
	require.NoError(t, s.Cluster.Env.Client.Get(t.Context(), client.ObjectKey{Name: nodeName}, &corev1.Node{}))
	during, err := e2e.EndpointsOf(t.Context(), c, ns, "web")
	require.NoError(t, err)
	assert.Equal(t, before, during, "the slices do not change while the kubelet is down")
	to := time.Now()
	require.NoError(t, node.StartKubelet())
	require.NoError(t, realnode.WaitReady(t.Context(), c.Env.Client, nodeName))
	tm.WaitRequestsAfter(t, loop, to, tm.MinInWindow)
	res := loop.Stop()

	tm.RequireWindow(t, res, "kubelet stopped", from, to)
	require.Empty(t, res.Failed(), "failed requests: %s", e2e.Failures(res))
}

// TestRealNodePodRecreatedOnAnotherNode: the Deployment's pods move from real-a to real-b (a
// rollout that changes their node): the new pods get addresses of real-b's range, real-b's
// agent publishes them, real-a's agent withdraws the old ones, and the request loop through the
// ClusterIP sees 0 failures.
func TestRealNodePodRecreatedOnAnotherNode(t *testing.T) {
	s, _ := realStack(t, nodeA, nodeB)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "move")
	require.NoError(t, s.Apply(t.Context(), ns, webResource(ns), deployment(ns, "1")))
	old := waitPods(t, c, ns, "1", 2)
	waitProgrammed(t, c, ns+"/web", 80, endpoints(old, 8080))

	loop := webTraffic(t, c, ns)
	from := time.Now()
	d := deployment(ns, "2")
	d.Spec.Template.Spec.NodeName = nodeB.Name
	require.NoError(t, s.Apply(t.Context(), ns, d))
	moved := waitPods(t, c, ns, "2", 2)
	for _, p := range moved {
		require.Equal(t, nodeB.Name, p.Spec.NodeName)
		require.True(t, netip.MustParsePrefix(nodeB.PodCIDR).Contains(netip.MustParseAddr(p.Status.PodIP)), p.Status.PodIP)
	}
	waitProgrammed(t, c, ns+"/web", 80, endpoints(moved, 8080))
	to := time.Now()
	tm.WaitRequestsAfter(t, loop, to, tm.MinInWindow)
	res := loop.Stop()

	tm.RequireWindow(t, res, "pods moved to another node", from, to)
	require.Empty(t, res.Failed(), "failed requests: %s", e2e.Failures(res))
}
