// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package nodes_test holds end-to-end scenario 7 of issue 10: the real programs (two controller
// replicas with leader election and one agent per node, as processes, from testkit/stack) on
// the cluster harness with a real kube-proxy. A node is deleted under a request loop through
// the Service's ClusterIP: the controller removes that node's slices and the traffic moves to
// the pod on the other node. It has its own stack: deleting a node cannot be undone. See
// development/E2E.md ("Nodes").
package nodes_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

func TestMain(m *testing.M) { cluster.RunIsolated(m) }

const (
	// minInWindow is the fewest requests the loop must send before the deletion and after the
	// traffic moved (one every 20 ms at most).
	minInWindow = 20
	// waitFor bounds every wait for a state.
	waitFor = time.Minute
	// loopLimit ends a request loop that a failing test forgot.
	loopLimit = 5 * time.Minute
)

// webManifest is an HTTP resource probed every second.
const webManifest = `
apiVersion: network.deckhouse.io/v1alpha1
kind: ServiceWithHealthchecks
metadata:
  name: web
spec:
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: http
  healthcheck:
    initialDelaySeconds: 0
    periodSeconds: 1
    probes:
    - mode: HTTP
      failureThreshold: 2
      http:
        targetPort: http
        path: /healthz
`

var webPorts = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}

// Scenario 7: node-b is deleted (its agent stops with it, as its DaemonSet pod would) while a
// loop sends requests through the ClusterIP. The controller removes node-b's slice, node-a's
// stays, and kube-proxy sends every new connection to the pod on node-a. The server on node-b
// keeps answering throughout (checked directly), so it is the slice's removal, not a failing
// probe, that moves the traffic; and no request of the loop fails.
//
// TestCiliumADeletedNodesSlicesGoAndTrafficMovesToTheOtherNode runs the same with a real
// cilium-agent instead of kube-proxy.
func TestADeletedNodesSlicesGoAndTrafficMovesToTheOtherNode(t *testing.T) {
	deletedNodesSlicesGo(t, stack.Options{})
}

// TestCiliumADeletedNodesSlicesGoAndTrafficMovesToTheOtherNode is scenario 7 on Cilium's
// dataplane (`make test-cilium`; skipped elsewhere).
func TestCiliumADeletedNodesSlicesGoAndTrafficMovesToTheOtherNode(t *testing.T) {
	if !cluster.CiliumEnabled() {
		t.Skipf("the Cilium dataplane runs in `make test-cilium` (%s=1)", cluster.CiliumEnv)
	}
	deletedNodesSlicesGo(t, stack.Options{Cilium: true})
}

// deletedNodesSlicesGo is scenario 7 on a stack started with opts.
func deletedNodesSlicesGo(t *testing.T, opts stack.Options) {
	s := stack.Start(t, opts)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "nodes")
	labels := map[string]string{"app": "web"}
	webA := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-a", Node: "node-a", Labels: labels, ContainerPorts: webPorts})
	webB := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-b", Node: "node-b", Labels: labels, ContainerPorts: webPorts})
	webA.ServeHTTP(t, 8080)
	srvB := webB.ServeHTTP(t, 8080)
	require.NoError(t, s.ApplyYAML(t.Context(), ns, []byte(webManifest)))
	eventuallySlices(t, c, ns, "web", map[string][]string{"web-http-node-a": {webA.IP.String()}, "web-http-node-b": {webB.IP.String()}})
	c.WaitProgrammed(t, ns+"/web", 80, webA, webB)

	loop := c.Traffic(t, cluster.TrafficOptions{Service: ns + "/web", Port: 80, Interval: 20 * time.Millisecond, Duration: loopLimit})
	require.Eventually(t, func() bool { return len(loop.Results()) >= minInWindow }, waitFor, 10*time.Millisecond)
	deleting := time.Now()
	require.NoError(t, s.DeleteNode(t.Context(), "node-b"))
	var node corev1.Node
	assert.True(t, apierrors.IsNotFound(c.Env.Client.Get(t.Context(), client.ObjectKey{Name: "node-b"}, &node)), "the Node object is gone")
	eventuallySlices(t, c, ns, "web", map[string][]string{"web-http-node-a": {webA.IP.String()}})
	slicesGone := time.Now()
	c.WaitProgrammed(t, ns+"/web", 80, webA)
	moved := time.Now()
	require.Eventually(t, func() bool { return len(loop.Results().Since(moved)) >= minInWindow }, waitFor, 10*time.Millisecond)
	res := loop.Stop()

	before := res.Before(deleting)
	require.GreaterOrEqual(t, len(before), minInWindow)
	assert.Equal(t, []string{webA.Key(), webB.Key()}, before.Pods(), "before the deletion both nodes' pods answer: %s", before)
	after := res.Since(moved)
	assert.GreaterOrEqual(t, len(after), minInWindow)
	assert.Equal(t, map[string]int{webA.Key(): len(after)}, after.ByPod(), "after it only node-a's pod gets new connections: %s", after)
	assert.Empty(t, res.Failed(), "no request of the loop fails: %s", res)

	// The pod on the deleted node still answers when dialled directly: nothing but the slice's
	// removal kept the loop away from it.
	assert.True(t, srvB.Running())
	direct := c.Requests(t, cluster.TrafficOptions{Address: webB.IP.String(), Port: 8080, Count: 3})
	assert.Equal(t, map[string]int{webB.Key(): 3}, direct.ByPod(), "node-b's server still answers directly: %s", direct)
	t.Logf("node-b deleted: its slice gone %v after DeleteNode began, %s routed only to node-a %v after; requests: %d before, %d after, %d failed",
		slicesGone.Sub(deleting).Round(time.Millisecond), c.Dataplane(), moved.Sub(deleting).Round(time.Millisecond), len(before), len(after), len(res.Failed()))
}

// eventuallySlices waits until the resource's slices are exactly the named ones, each with the
// given addresses, all ready and serving.
func eventuallySlices(t *testing.T, c *cluster.Cluster, ns, resource string, want map[string][]string) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		var list discoveryv1.EndpointSliceList
		require.NoError(ct, c.Env.Client.List(t.Context(), &list, client.InNamespace(ns), client.MatchingLabels{wellknown.LabelResource: resource}))
		got := map[string][]string{}
		for _, s := range list.Items {
			got[s.Name] = []string{}
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready && e.Conditions.Serving != nil && *e.Conditions.Serving {
					got[s.Name] = append(got[s.Name], e.Addresses...)
				}
			}
			slices.Sort(got[s.Name])
		}
		assert.Equal(ct, want, got)
	}, waitFor, 20*time.Millisecond)
}
