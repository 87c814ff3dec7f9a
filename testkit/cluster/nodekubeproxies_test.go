// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster_test

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// TestEveryNodeRunsItsOwnKubeProxyInItsOwnNetwork checks Options.NodeKubeProxies: each node is a
// network namespace of its own with its own kube-proxy, its pods hang off it, node ports and
// health check node ports answer per node from that node's local endpoints, and the simulated
// load balancer follows the health checks. Nothing is left once the cluster stops.
func TestEveryNodeRunsItsOwnKubeProxyInItsOwnNetwork(t *testing.T) {
	cluster.SkipUnlessIsolated(t)
	var pids []int
	var links []string
	t.Run("a cluster whose nodes have their own kube-proxies", func(t *testing.T) {
		c := cluster.Start(t, cluster.Options{Nodes: twoZones, NodeKubeProxies: true})
		self, err := os.Readlink("/proc/self/ns/net")
		require.NoError(t, err)
		netnsOf := map[string]string{}
		for _, n := range []string{"node-a", "node-b"} {
			pid := c.NodeKubeProxyPID(n)
			require.Positive(t, pid, "node %s runs a kube-proxy", n)
			pids = append(pids, pid)
			exe, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "exe"))
			require.NoError(t, err)
			assert.Equal(t, "kube-proxy", filepath.Base(exe), "nsenter became kube-proxy")
			netnsOf[n], err = os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "ns", "net"))
			require.NoError(t, err)
			assert.NotEqual(t, self, netnsOf[n], "the kube-proxy of %s runs outside the cluster namespace", n)
			var nodeNS string
			require.NoError(t, c.InNodeNetns(n, func() error {
				nodeNS, err = os.Readlink("/proc/thread-self/ns/net")
				return err
			}))
			assert.Equal(t, nodeNS, netnsOf[n], "the kube-proxy of %s runs in the node's namespace", n)
		}
		assert.NotEqual(t, netnsOf["node-a"], netnsOf["node-b"], "each node has its own namespace")
		assert.Zero(t, c.KubeProxyPID(), "no kube-proxy in the cluster namespace")

		ns := c.Env.CreateNamespaceForTest(t, "nodes")
		a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "a", Node: "node-a"})
		b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "b", Node: "node-b"})
		a.ServeHTTP(t, 8080)
		b.ServeHTTP(t, 8080)
		links = append(links, a.HostLink, b.HostLink)
		// The cluster namespace reaches the pods through their nodes (the agents probe this way).
		for _, p := range []*cluster.Pod{a, b} {
			res := c.Requests(t, cluster.TrafficOptions{Address: p.IP.String(), Port: 8080, Count: 3})
			assert.Equal(t, []string{p.Key()}, res.Pods(), "%s", res)
			_, err := net.InterfaceByName(p.HostLink)
			assert.Error(t, err, "the pod's veth pair ends in its node, not in the cluster namespace")
		}

		svc := createLocalLoadBalancer(t, c, ns, "web", 80, 8080)
		nodePort, hcPort := svc.Spec.Ports[0].NodePort, svc.Spec.HealthCheckNodePort
		require.Positive(t, nodePort, "the API server allocates a node port")
		require.Positive(t, hcPort, "the API server allocates a health check node port")
		writeSlice(t, c, ns, "web", "web-a", 8080, a.Endpoint(ready))
		writeSlice(t, c, ns, "web", "web-b", 8080, b.Endpoint(ready))

		lb := c.LoadBalancer(t, cluster.LoadBalancerOptions{HealthCheckNodePort: hcPort, NodePort: nodePort})
		require.Eventually(t, func() bool { return lb.Healthy("node-a") && lb.Healthy("node-b") }, time.Minute, 20*time.Millisecond,
			"both nodes pass: node-a %s; node-b %s", lb.Checks("node-a"), lb.Checks("node-b"))
		last := lb.Checks("node-a")[len(lb.Checks("node-a"))-1]
		assert.Equal(t, 1, last.LocalEndpoints, "kube-proxy's body counts node-a's one endpoint")
		assert.Equal(t, ns+"/web", last.Service)
		assert.True(t, last.ServiceProxyHealthy)

		// externalTrafficPolicy: Local: a node port leads to the node's own pods only.
		for node, pod := range map[string]*cluster.Pod{"node-a": a, "node-b": b} {
			res := c.Requests(t, cluster.TrafficOptions{Address: c.Node(node).IP.String(), Port: nodePort, Count: 10})
			assert.Equal(t, []string{pod.Key()}, res.Pods(), "through %s: %s", node, res)
			assert.Equal(t, 10, res.OK(), "through %s: %s", node, res)
		}
		res := lb.Traffic(t, cluster.TrafficOptions{Count: 20}).Wait()
		assert.Equal(t, 20, res.OK(), "%s", res)
		assert.Equal(t, []string{a.Key(), b.Key()}, res.Pods(), "the load balancer spreads over both nodes")

		// node-a's pod is withdrawn: node-a fails its check, the load balancer leaves it.
		withdrawn := time.Now()
		writeSlice(t, c, ns, "web", "web-a", 8080, a.Endpoint(notReady))
		require.Eventually(t, func() bool { return !lb.Healthy("node-a") }, time.Minute, 20*time.Millisecond, "node-a: %s", lb.Checks("node-a"))
		first, ok := lb.Checks("node-a").Since(withdrawn).FirstNotOK()
		require.True(t, ok)
		assert.Equal(t, 503, first.Status)
		assert.Equal(t, 0, first.LocalEndpoints)
		assert.True(t, lb.Healthy("node-b"))
		// Before the slices reached it, node-b's health check port was closed, then 503.
		healthyB := lb.Changes("node-b")[0].At
		assert.Empty(t, lb.Checks("node-b").Since(healthyB).NotOK(), "node-b passes from the moment it was healthy")
		changes := lb.Changes("node-a")
		if assert.Len(t, changes, 2, "node-a became healthy, then unhealthy") {
			assert.True(t, changes[0].Healthy)
			assert.False(t, changes[1].Healthy)
		}
		res = lb.Traffic(t, cluster.TrafficOptions{Count: 20}).Wait()
		assert.Equal(t, 20, res.OK(), "%s", res)
		assert.Equal(t, []string{b.Key()}, res.Pods(), "the load balancer sends only to node-b")
	})

	for _, pid := range pids {
		assert.Error(t, syscall.Kill(pid, 0), "kube-proxy %d is still running", pid)
	}
	for _, l := range links {
		_, err := net.InterfaceByName(l)
		assert.Error(t, err, "link %s is left", l)
	}
	assert.Empty(t, cluster.Leftovers())
}

// createLocalLoadBalancer creates a Service of type LoadBalancer with
// externalTrafficPolicy: Local and no selector, with one TCP port "main", and returns it as the
// API server stored it (node port and health check node port allocated).
func createLocalLoadBalancer(t testing.TB, c *cluster.Cluster, ns, name string, port, targetPort int32) *corev1.Service {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeLoadBalancer,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports: []corev1.ServicePort{{
				Name: "main", Port: port, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(targetPort),
			}},
		},
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), svc))
	return svc
}
