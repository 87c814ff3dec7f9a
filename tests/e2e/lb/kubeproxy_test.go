// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package lb_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// handManagedBy marks the EndpointSlices these tests write by hand: neither the agents nor the
// controller touch slices they do not manage.
const handManagedBy = "e2e-lb-test"

var (
	readyConds       = discoveryv1.EndpointConditions{Ready: ref(true), Serving: ref(true), Terminating: ref(false)}
	notReadyConds    = discoveryv1.EndpointConditions{Ready: ref(false), Serving: ref(false), Terminating: ref(false)}
	drainingConds    = discoveryv1.EndpointConditions{Ready: ref(false), Serving: ref(true), Terminating: ref(true)}
	terminatingConds = discoveryv1.EndpointConditions{Ready: ref(false), Serving: ref(false), Terminating: ref(true)}
)

// TestKubeProxyCountsOnlyReadyLocalEndpointsForTheHealthCheck confirms on the real kube-proxy
// (the pinned version, one per node) what a node's healthCheckNodePort answers for each shape
// of endpoint the agents publish, with slices written by hand for a plain Service of type
// LoadBalancer with externalTrafficPolicy: Local, and whether the node's node port still gives
// new connections to that endpoint. Each case starts from the opposite answer, so the answer
// asserted is kube-proxy's reaction to the change, not its state before the slice arrived.
func TestKubeProxyCountsOnlyReadyLocalEndpointsForTheHealthCheck(t *testing.T) {
	s := shared.Get(t)
	c := s.Cluster
	cases := map[string]struct {
		from, to discoveryv1.EndpointConditions
		// status and localEndpoints the health check answers for "to".
		status, localEndpoints int
		// nodePortServes: new connections through the node's node port reach the pod.
		nodePortServes bool
	}{
		"a ready endpoint counts and gets the node's new connections": {
			from: notReadyConds, to: readyConds, status: 200, localEndpoints: 1, nodePortServes: true,
		},
		"a serving terminating endpoint does not count but still gets the node's new connections": {
			from: readyConds, to: drainingConds, status: 503, localEndpoints: 0, nodePortServes: true,
		},
		"an endpoint that does not serve neither counts nor gets connections": {
			from: readyConds, to: notReadyConds, status: 503, localEndpoints: 0, nodePortServes: false,
		},
		"a terminating endpoint that does not serve neither counts nor gets connections": {
			from: readyConds, to: terminatingConds, status: 503, localEndpoints: 0, nodePortServes: false,
		},
		"an endpoint without conditions counts as ready": {
			from: notReadyConds, to: discoveryv1.EndpointConditions{}, status: 200, localEndpoints: 1, nodePortServes: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ns := c.Env.CreateNamespaceForTest(t, "kube-proxy")
			a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "a", Node: "node-a"})
			a.ServeHTTP(t, 8080)
			svc := createLocalLoadBalancer(t, c, ns, "web", map[string]int32{"main": 8080})
			writeHandSlice(t, c, ns, "web", "web-main", "main", 8080, a.Endpoint(tc.from))
			lb := c.LoadBalancer(t, cluster.LoadBalancerOptions{Nodes: []string{"node-a"}, HealthCheckNodePort: svc.Spec.HealthCheckNodePort, CheckInterval: checkInterval})
			fromStatus, fromLocal := 503, 0
			if tc.status == 503 {
				fromStatus, fromLocal = 200, 1
			}
			waitAnswer(t, lb, "node-a", time.Now(), fromStatus, fromLocal)

			changed := time.Now()
			writeHandSlice(t, c, ns, "web", "web-main", "main", 8080, a.Endpoint(tc.to))
			h := waitAnswer(t, lb, "node-a", changed, tc.status, tc.localEndpoints)
			assert.Equal(t, ns+"/web", h.Service, "kube-proxy's body names the Service")
			assert.True(t, h.ServiceProxyHealthy, "kube-proxy itself is healthy: only the endpoints decide")

			res := c.Requests(t, cluster.TrafficOptions{Address: nodeAddr(c, "node-a"), Port: svc.Spec.Ports[0].NodePort, Count: 3, Timeout: time.Second})
			if tc.nodePortServes {
				assert.Equal(t, map[string]int{a.Key(): 3}, res.ByPod(), "new connections through node-a's node port reach the pod: %s", res)
			} else {
				assert.Zero(t, res.OK(), "no new connection through node-a's node port is served: %s", res)
				direct := c.Requests(t, cluster.TrafficOptions{Address: ip(a), Port: 8080, Count: 1})
				assert.Equal(t, 1, direct.OK(), "the pod itself answers, so kube-proxy kept the connections away: %s", direct)
			}
		})
	}
}

// TestKubeProxyCountsAPodReadyOnAnyPortOfTheServiceForTheHealthCheck confirms that kube-proxy
// counts local endpoints per Service by address, across ports: a pod ready on one port of two
// keeps its node healthy, while the node port of the other port serves nothing on that node.
// This is what the agents' per-port slices mean for externalTrafficPolicy: Local (docs/CR.md).
func TestKubeProxyCountsAPodReadyOnAnyPortOfTheServiceForTheHealthCheck(t *testing.T) {
	s := shared.Get(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "kube-proxy-ports")
	a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "a", Node: "node-a"})
	a.ServeHTTP(t, 8080)
	a.ServeHTTP(t, 9090)
	svc := createLocalLoadBalancer(t, c, ns, "web", map[string]int32{"main": 8080, "alt": 9090})
	writeHandSlice(t, c, ns, "web", "web-main", "main", 8080, a.Endpoint(notReadyConds))
	writeHandSlice(t, c, ns, "web", "web-alt", "alt", 9090, a.Endpoint(notReadyConds))
	lb := c.LoadBalancer(t, cluster.LoadBalancerOptions{Nodes: []string{"node-a"}, HealthCheckNodePort: svc.Spec.HealthCheckNodePort, CheckInterval: checkInterval})
	waitAnswer(t, lb, "node-a", time.Now(), 503, 0)

	changed := time.Now()
	writeHandSlice(t, c, ns, "web", "web-main", "main", 8080, a.Endpoint(readyConds))
	waitAnswer(t, lb, "node-a", changed, 200, 1)
	nodePorts := map[string]int32{}
	for _, p := range svc.Spec.Ports {
		nodePorts[p.Name] = p.NodePort
	}
	main := c.Requests(t, cluster.TrafficOptions{Address: nodeAddr(c, "node-a"), Port: nodePorts["main"], Count: 3, Timeout: time.Second})
	assert.Equal(t, map[string]int{a.Key(): 3}, main.ByPod(), "the ready port is served through node-a: %s", main)
	alt := c.Requests(t, cluster.TrafficOptions{Address: nodeAddr(c, "node-a"), Port: nodePorts["alt"], Count: 3, Timeout: time.Second})
	assert.Zero(t, alt.OK(), "the port that is not ready gets no connection through node-a, though node-a passes its health check: %s", alt)
}

// waitAnswer waits until the node's latest health check since t answers status with
// localEndpoints, and returns that check.
func waitAnswer(t *testing.T, lb *cluster.LoadBalancer, node string, since time.Time, status, localEndpoints int) cluster.HealthCheck {
	t.Helper()
	var last cluster.HealthCheck
	require.Eventually(t, func() bool {
		cs := lb.Checks(node).Since(since)
		if len(cs) == 0 {
			return false
		}
		last = cs[len(cs)-1]
		return last.Status == status && last.LocalEndpoints == localEndpoints
	}, waitFor, poll, "%s answers %d with localEndpoints %d: %s", node, status, localEndpoints, lb.Checks(node).Since(since))
	return last
}

// createLocalLoadBalancer creates a Service of type LoadBalancer with
// externalTrafficPolicy: Local and no selector, with one TCP port per name (port 80, 81, ... in
// name order, to the target port given), and returns it with its allocated node ports.
func createLocalLoadBalancer(t *testing.T, c *cluster.Cluster, ns, name string, targets map[string]int32) *corev1.Service {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeLoadBalancer,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
		},
	}
	port := int32(80)
	for _, n := range []string{"alt", "main"} {
		if target, ok := targets[n]; ok {
			svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: n, Port: port, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(target)})
			port++
		}
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), svc))
	require.Positive(t, svc.Spec.HealthCheckNodePort, "the API server allocates a health check node port")
	return svc
}

// writeHandSlice creates or replaces an EndpointSlice of the Service with the endpoints on one
// named port.
func writeHandSlice(t *testing.T, c *cluster.Cluster, ns, service, name, port string, target int32, eps ...discoveryv1.Endpoint) {
	t.Helper()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: service,
			discoveryv1.LabelManagedBy:   handManagedBy,
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: ref(port), Port: ref(target), Protocol: ref(corev1.ProtocolTCP)}},
	}
	existing := &discoveryv1.EndpointSlice{}
	err := c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(slice), existing)
	switch {
	case apierrors.IsNotFound(err):
		require.NoError(t, c.Env.Client.Create(t.Context(), slice))
	case err == nil:
		slice.ResourceVersion = existing.ResourceVersion
		require.NoError(t, c.Env.Client.Update(t.Context(), slice))
	default:
		require.NoError(t, err)
	}
}

// ref is a pointer to a copy of v (slice conditions and ports are pointers).
func ref[T any](v T) *T { return &v }
