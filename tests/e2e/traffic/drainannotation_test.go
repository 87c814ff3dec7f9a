// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// The per-pod drain (issue 29 part 4) through a real kube-proxy: of two pods, one is annotated
// network.deckhouse.io/drain and later not. While drained its endpoint is ready=false,
// serving=true, terminating=true (the triple kube-proxy and Cilium read alike): kube-proxy gives
// it no new connection while the other pod is ready, and a connection opened before the drain
// keeps working on it. A request loop across the drain and the undrain loses nothing.
//
// The same scenario runs on Cilium (TestCiliumDrainAnnotationLosesNoRequestAndKeepsConnections).
func TestDrainAnnotationLosesNoRequestAndKeepsConnections(t *testing.T) {
	drainAnnotationLosesNoRequest(t, testStack(t))
}

// drainAnnotationLosesNoRequest is the per-pod drain scenario on the stack's dataplane.
func drainAnnotationLosesNoRequest(t *testing.T, s *stack.Stack) {
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "drain-annotation")
	labels := map[string]string{"app": "web"}
	a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-a", Node: "node-a", Labels: labels, ContainerPorts: webPorts})
	b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-b", Node: "node-b", Labels: labels, ContainerPorts: webPorts})
	srvA := a.ServeHTTP(t, 8080)
	b.ServeHTTP(t, 8080)
	createResource(t, c, kit.Resource(ns, "web", labels,
		[]v1alpha1.ServicePort{e2e.ServicePort("http", 80, intstr.FromString("http"))},
		kit.HTTPProbe(intstr.FromString("http"))))
	both := map[string]map[string]string{"web-http-node-a": {ip(a): "TTF"}, "web-http-node-b": {ip(b): "TTF"}}
	kit.EventuallyEndpoints(t, c, ns, "web", both)
	c.WaitProgrammed(t, ns+"/web", 80, a, b)
	w := watchSlices(t, c, ns)
	svc := &corev1.Service{}
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "web"}, svc))
	kept := keptConnTo(t, net.JoinHostPort(svc.Spec.ClusterIP, "80"), a.Key())

	loop := c.Traffic(t, cluster.TrafficOptions{Service: ns + "/web", Port: 80, Duration: loopFor})
	logTimelineOnFailure(t, w, loop)
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)

	// Drained: out of new connections, still probed, the kept connection still on it.
	draining := time.Now()
	setDrain(t, c, a, `"web"`)
	kit.EventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(a): "FTT"}, "web-http-node-b": {ip(b): "TTF"}})
	c.WaitProgrammed(t, ns+"/web", 80, b)
	drained := time.Now()
	hits := srvA.Hits()
	require.Eventually(t, func() bool { return srvA.Hits() >= hits+3 }, waitFor, poll, "the agent keeps probing the drained pod")
	kit.WaitRequestsAfter(t, loop, drained, minInWindow)
	pod, reused, err := kept.Get(t.Context())
	require.NoError(t, err, "the kept connection's request while drained")
	assert.True(t, reused, "the request went over the connection opened before the drain")
	assert.Equal(t, a.Key(), pod, "the kept connection stays with the drained pod")

	// Undrained: published on its verdict again, new connections reach it again.
	undraining := time.Now()
	setDrain(t, c, a, "null")
	kit.EventuallyEndpoints(t, c, ns, "web", both)
	c.WaitProgrammed(t, ns+"/web", 80, a, b)
	undrained := time.Now()
	kit.WaitRequestsAfter(t, loop, undrained, minInWindow)
	require.Eventually(t, func() bool { return loop.Results().Since(undrained).ByPod()[a.Key()] > 0 }, waitFor, poll,
		"new connections reach the undrained pod")
	res := loop.Stop()

	window := kit.RequireWindow(t, res, "the drain and the undrain", draining, undrained)
	assert.Empty(t, res.Failed(), "requests across the drain: %s; failed: %s", res, e2e.Failures(res))
	whileDrained := between(res, drained, undraining)
	assert.Equal(t, map[string]int{b.Key(): len(whileDrained)}, whileDrained.ByPod(), "while drained, only the other pod gets new connections")
	assert.Positive(t, res.Before(draining).ByPod()[a.Key()], "the pod answered before the drain: %s", res.Before(draining))
	assert.Equal(t, []string{
		"web-http-node-a: " + ip(a) + " TTF -> FTT",
		"web-http-node-a: " + ip(a) + " FTT -> TTF",
	}, about(w.ConditionChanges(), ip(a)), "the drained pod's only changes: not ready while drained, ready again")
	t.Logf("drain annotation: %d requests in the window (%s), %d failed; %d in the whole loop",
		len(window), undrained.Sub(draining).Round(time.Millisecond), len(window.Failed()), len(res))
	record(t, "drain annotation", res, window)
}

// setDrain sets the pod's drain annotation to a JSON value (a quoted string, or null to remove
// it) with a merge patch, as kubectl annotate does.
func setDrain(t *testing.T, c *cluster.Cluster, p *cluster.Pod, jsonValue string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, wellknown.AnnotationDrain, jsonValue)
	obj := &corev1.Pod{}
	obj.Namespace, obj.Name = p.Namespace, p.Name
	require.NoError(t, c.Env.Client.Patch(t.Context(), obj, client.RawPatch(types.MergePatchType, []byte(patch))))
}

// keptConnTo opens keep-alive connections to addr until one is routed to the pod named want
// (kube-proxy picks an endpoint per connection) and returns it.
func keptConnTo(t *testing.T, addr, want string) *cluster.KeptConn {
	t.Helper()
	for range 100 {
		k := cluster.NewKeptConn(addr)
		pod, _, err := k.Get(t.Context())
		require.NoError(t, err)
		if pod == want {
			t.Cleanup(k.Close)
			return k
		}
		k.Close()
	}
	require.FailNow(t, "no connection routed to "+want+" in 100 tries")
	return nil
}
