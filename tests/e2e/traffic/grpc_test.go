// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/grpchealth"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// grpcPorts are the container ports of the gRPC pods: web (HTTP) and grpc.
var grpcPorts = []corev1.ContainerPort{
	{Name: "web", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
	{Name: "grpc", ContainerPort: 9090, Protocol: corev1.ProtocolTCP},
}

// serveGRPCHealth starts a grpc-go health server on port 9090 of the pod (its listener is made
// inside the pod's network namespace); it stops with the test.
func serveGRPCHealth(t *testing.T, p *cluster.Pod) *grpchealth.Server {
	t.Helper()
	var ln net.Listener
	require.NoError(t, p.InNetns(func() error {
		var err error
		ln, err = net.Listen("tcp", ":9090")
		return err
	}))
	s := grpchealth.Serve(ln, grpchealth.Options{})
	t.Cleanup(s.Stop)
	return s
}

// Two pods serve HTTP (web) and gRPC health (grpc); the resource probes each port. When one
// pod's health service answers NOT_SERVING, the agent withdraws it from the grpc port only: its
// web endpoint stays ready and web requests through the ClusterIP (through a real kube-proxy)
// lose nothing. When it serves again, it is published again.
func TestGRPCNotServingWithdrawsThePodFromItsGRPCPortOnly(t *testing.T) {
	s := testStack(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "grpc")
	labels := map[string]string{"app": "orders"}
	a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "orders-a", Node: "node-a", Labels: labels, ContainerPorts: grpcPorts})
	b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "orders-b", Node: "node-b", Labels: labels, ContainerPorts: grpcPorts})
	a.ServeHTTP(t, 8080)
	b.ServeHTTP(t, 8080)
	healthA := serveGRPCHealth(t, a)
	serveGRPCHealth(t, b)
	grpcProbe := v1alpha1.Probe{Mode: v1alpha1.ProbeModeGRPC, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: failureThreshold,
		GRPC: &v1alpha1.GRPCProbe{TargetPort: intstr.FromString("grpc")}}
	createResource(t, c, kit.Resource(ns, "orders", labels,
		[]v1alpha1.ServicePort{e2e.ServicePort("web", 80, intstr.FromString("web")), e2e.ServicePort("grpc", 9090, intstr.FromString("grpc"))},
		kit.HTTPProbe(intstr.FromInt32(8080)), grpcProbe))
	all := map[string]map[string]string{
		"orders-web-node-a":  {ip(a): "TTF"},
		"orders-web-node-b":  {ip(b): "TTF"},
		"orders-grpc-node-a": {ip(a): "TTF"},
		"orders-grpc-node-b": {ip(b): "TTF"},
	}
	kit.EventuallyEndpoints(t, c, ns, "orders", all)
	c.WaitProgrammed(t, ns+"/orders", 80, a, b)
	w := watchSlices(t, c, ns)

	loop := c.Traffic(t, cluster.TrafficOptions{Service: ns + "/orders", Port: 80, Duration: loopFor})
	logTimelineOnFailure(t, w, loop)
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)
	flipped := time.Now()
	healthA.Set("", grpchealth.NotServing)
	kit.EventuallyEndpoints(t, c, ns, "orders", map[string]map[string]string{
		"orders-web-node-a":  {ip(a): "TTF"},
		"orders-web-node-b":  {ip(b): "TTF"},
		"orders-grpc-node-a": {ip(a): "FFF"},
		"orders-grpc-node-b": {ip(b): "TTF"},
	})
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)

	healthA.Set("", grpchealth.Serving)
	kit.EventuallyEndpoints(t, c, ns, "orders", all)
	back := time.Now()
	kit.WaitRequestsAfter(t, loop, back, minInWindow)
	res := loop.Stop()

	window := kit.RequireWindow(t, res, "from NOT_SERVING to SERVING again", flipped, back)
	assert.Empty(t, res.Failed(), "web requests through the ClusterIP while one pod's gRPC health failed: %s; failed: %s", res, e2e.Failures(res))
	assert.Equal(t, []string{
		"orders-grpc-node-a: " + ip(a) + " TTF -> FFF",
		"orders-grpc-node-a: " + ip(a) + " FFF -> TTF",
	}, w.ConditionChanges(), "only pod a's grpc port changed, once each way")
	t.Logf("gRPC NOT_SERVING: %d web requests in the window (%s), %d failed", len(window), back.Sub(flipped).Round(time.Millisecond), len(window.Failed()))
}
