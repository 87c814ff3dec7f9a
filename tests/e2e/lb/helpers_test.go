// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package lb_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// Timing of the scenarios. Probes run every second; a port flips after failureThreshold
// failures (or successThreshold successes).
const (
	periodSeconds    = 1
	failureThreshold = 2
	successThreshold = 1
	timeoutSeconds   = 1
	// bound is issue 21's deadline for a probe failure to reach a node's health check:
	// periodSeconds × failureThreshold + timeoutSeconds + 1 s (the publish allowance: the
	// agent's coalescing, the slice write, kube-proxy's sync). Tests assert 3 × bound.
	bound = (periodSeconds*failureThreshold+timeoutSeconds)*time.Second + time.Second
	// recoveryBound is the same for a recovery (successThreshold passes).
	recoveryBound = (periodSeconds*successThreshold+timeoutSeconds)*time.Second + time.Second
	// checkInterval is how often the simulated load balancer checks each node, like a cloud
	// load balancer's health check interval (cloud ones use seconds; 100 ms shows the product's
	// own delay).
	checkInterval = 100 * time.Millisecond
	// minInWindow is the fewest requests a loop must send inside a window (one every 10 ms).
	minInWindow = 50
	// minChecksInWindow is the fewest health checks of a node inside a window (one every
	// 100 ms), so "no failed check" cannot pass on silence.
	minChecksInWindow = 20
	// waitFor bounds every wait for a published state (well over 3 × bound).
	waitFor = time.Minute
	// poll is the polling interval of those waits.
	poll = 20 * time.Millisecond
	// loopFor bounds every background request loop; tests stop theirs long before.
	loopFor = 10 * time.Minute
)

// kit holds the shared e2e helpers with this suite's timing.
var kit = e2e.Timing{
	PeriodSeconds: periodSeconds, FailureThreshold: failureThreshold, MinInWindow: minInWindow, WaitFor: waitFor, Poll: poll,
}

// webPorts are the container ports of the web pods.
var webPorts = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}

// scene is one scenario's resource: pods a (node-a) and b (node-b) serving HTTP on 8080, the
// ServiceWithHealthchecks of type LoadBalancer with externalTrafficPolicy: Local that selects
// them, its child Service's node port and health check node port, and the load balancer
// polling both nodes.
type scene struct {
	ns, name   string
	a, b       *cluster.Pod
	srvA, srvB *cluster.Server
	nodePort   int32
	hcPort     int32
	lb         *cluster.LoadBalancer
	// healthy is when the load balancer first saw both nodes healthy.
	healthy time.Time
}

// newScene creates the pods and the resource, waits until both pods are published ready, the
// child Service has its node port and health check node port, and the load balancer sees both
// nodes healthy.
func newScene(t *testing.T, s *stack.Stack, prefix string) *scene {
	t.Helper()
	c := s.Cluster
	sc := &scene{ns: c.Env.CreateNamespaceForTest(t, prefix), name: "web"}
	labels := map[string]string{"app": "web"}
	sc.a = c.AddPod(t, cluster.PodSpec{Namespace: sc.ns, Name: "web-a", Node: "node-a", Labels: labels, ContainerPorts: webPorts})
	sc.b = c.AddPod(t, cluster.PodSpec{Namespace: sc.ns, Name: "web-b", Node: "node-b", Labels: labels, ContainerPorts: webPorts})
	sc.srvA = sc.a.ServeHTTP(t, 8080)
	sc.srvB = sc.b.ServeHTTP(t, 8080)
	swh := &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Namespace: sc.ns, Name: sc.name},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Type:                  corev1.ServiceTypeLoadBalancer,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Selector:              labels,
			Ports:                 []v1alpha1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("http")}},
			Healthcheck: &v1alpha1.Healthcheck{InitialDelaySeconds: 0, PeriodSeconds: periodSeconds, Probes: []v1alpha1.Probe{{
				Mode: v1alpha1.ProbeModeHTTP, TimeoutSeconds: timeoutSeconds, SuccessThreshold: successThreshold, FailureThreshold: failureThreshold,
				HTTP: &v1alpha1.HTTPProbe{TargetPort: intstr.FromString("http"), Path: "/healthz", Method: "GET", Scheme: corev1.URISchemeHTTP},
			}}},
		},
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), swh))
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		svc := &corev1.Service{}
		require.NoError(ct, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(swh), svc))
		assert.Equal(ct, corev1.ServiceTypeLoadBalancer, svc.Spec.Type)
		assert.Equal(ct, corev1.ServiceExternalTrafficPolicyLocal, svc.Spec.ExternalTrafficPolicy)
		assert.Empty(ct, svc.Spec.Selector, "the child Service has no selector: only the agents' slices feed it")
		require.Len(ct, svc.Spec.Ports, 1)
		assert.Positive(ct, svc.Spec.Ports[0].NodePort, "the API server allocated a node port")
		assert.Positive(ct, svc.Spec.HealthCheckNodePort, "the API server allocated a health check node port")
		sc.nodePort, sc.hcPort = svc.Spec.Ports[0].NodePort, svc.Spec.HealthCheckNodePort
	}, waitFor, poll, "the controller creates the LoadBalancer Service of %s", swh.Name)
	kit.EventuallyEndpoints(t, c, sc.ns, sc.name, map[string]map[string]string{
		"web-http-node-a": {ip(sc.a): "TTF"},
		"web-http-node-b": {ip(sc.b): "TTF"},
	})
	sc.lb = c.LoadBalancer(t, cluster.LoadBalancerOptions{
		Nodes: []string{"node-a", "node-b"}, HealthCheckNodePort: sc.hcPort, NodePort: sc.nodePort, CheckInterval: checkInterval,
	})
	require.Eventually(t, func() bool { return sc.lb.Healthy("node-a") && sc.lb.Healthy("node-b") }, waitFor, poll,
		"the load balancer sees both nodes healthy: node-a %s; node-b %s", sc.lb.Checks("node-a"), sc.lb.Checks("node-b"))
	sc.healthy = time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range []string{"node-a", "node-b"} {
				t.Logf("health checks of %s: %s; changes %v", n, sc.lb.Checks(n), sc.lb.Changes(n))
			}
		}
	})
	return sc
}

// nodeAddr is the node's address, where its node ports listen.
func nodeAddr(c *cluster.Cluster, node string) string { return c.Node(node).IP.String() }

// answeredAt is when a health check's answer arrived.
func answeredAt(h cluster.HealthCheck) time.Time { return h.Start.Add(h.Duration) }

// requireAllPass asserts that every check of the node between from and to passed with
// kube-proxy counting one local endpoint, and that there were at least minChecksInWindow.
func requireAllPass(t *testing.T, lb *cluster.LoadBalancer, node string, from, to time.Time, what string) cluster.HealthChecks {
	t.Helper()
	in := lb.Checks(node).Since(from).Before(to)
	require.GreaterOrEqual(t, len(in), minChecksInWindow, "%s: health checks of %s in the window %s..%s", what, node,
		from.Format("15:04:05.000"), to.Format("15:04:05.000"))
	assert.Empty(t, in.NotOK(), "%s: %s never fails its health check: %s", what, node, in)
	for _, h := range in {
		if h.LocalEndpoints != 1 {
			assert.Equal(t, 1, h.LocalEndpoints, "%s: kube-proxy on %s counts its one ready pod at %s", what, node, h)
			break
		}
	}
	return in
}

func ip(p *cluster.Pod) string { return p.IP.String() }

// waitChecksAfter waits until the load balancer has checked the node n times after t.
func waitChecksAfter(tb testing.TB, lb *cluster.LoadBalancer, node string, after time.Time, n int) {
	tb.Helper()
	require.Eventually(tb, func() bool { return len(lb.Checks(node).Since(after)) >= n }, waitFor, poll,
		"%d health checks of %s after %s", n, node, after.Format("15:04:05.000"))
}

// newKeptConn is one keep-alive connection to addr, closed when the test ends.
func newKeptConn(t *testing.T, addr string) *cluster.KeptConn {
	t.Helper()
	k := cluster.NewKeptConn(addr)
	t.Cleanup(k.Close)
	return k
}

// figures logs one line of measured figures (run with -v; collected into
// development/BENCHMARKS-HISTORY.md, "End-to-end: external load balancers").
func figures(t *testing.T, scenario string, kv ...any) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "FIGURES scenario=%q", scenario)
	for i := 0; i+1 < len(kv); i += 2 {
		v := kv[i+1]
		if d, ok := v.(time.Duration); ok {
			v = d.Round(time.Millisecond).String()
		}
		fmt.Fprintf(&b, " %v=%v", kv[i], v)
	}
	t.Log(b.String())
}
