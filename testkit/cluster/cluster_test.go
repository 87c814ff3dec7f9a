// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// testManagedBy marks the EndpointSlices these tests write by hand.
const testManagedBy = "testkit-cluster-test"

var (
	ready       = discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}
	notReady    = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
	terminating = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	gone        = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(true)}
)

var twoZones = []cluster.Node{{Name: "node-a", Zone: "zone-a"}, {Name: "node-b", Zone: "zone-b"}}

// createService creates a Service without a selector (nothing writes its EndpointSlices but
// the test) with one TCP port "main" and returns "namespace/name".
func createService(t testing.TB, c *cluster.Cluster, ns, name string, port, targetPort int32) string {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: "main", Port: port, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(targetPort),
		}}},
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), svc))
	return ns + "/" + name
}

// writeSlice creates or replaces the EndpointSlice name of the Service with the endpoints, all
// on port "main" = targetPort.
func writeSlice(t testing.TB, c *cluster.Cluster, ns, service, name string, targetPort int32, eps ...discoveryv1.Endpoint) {
	t.Helper()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: service,
			discoveryv1.LabelManagedBy:   testManagedBy,
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("main"), Port: ptr.To(targetPort), Protocol: ptr.To(corev1.ProtocolTCP)}},
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

// TestServiceTrafficFollowsEndpointSlices drives a real kube-proxy with EndpointSlices written
// by the test and sends real requests through the ClusterIP.
func TestServiceTrafficFollowsEndpointSlices(t *testing.T) {
	c := cluster.Start(t, cluster.Options{Nodes: twoZones, KubeProxy: true})

	t.Run("requests through the ClusterIP reach exactly the ready endpoints", func(t *testing.T) {
		cases := map[string]struct {
			protocol cluster.Protocol
		}{
			"over HTTP":                  {protocol: cluster.HTTP},
			"over plain TCP":             {protocol: cluster.TCP},
			"over SMTP (a TCP dialogue)": {protocol: cluster.SMTP},
		}
		for name, tc := range cases {
			t.Run(name, func(t *testing.T) {
				ns := c.Env.CreateNamespaceForTest(t, "ready")
				const port, target = 80, 8080
				a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "a", Node: "node-a"})
				b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "b", Node: "node-b"})
				idle := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "idle", Node: "node-a", NotReady: true})
				var idleSrv *cluster.Server
				for _, p := range []*cluster.Pod{a, b, idle} {
					srv := serve(t, p, tc.protocol, target)
					if p == idle {
						idleSrv = srv
					}
				}
				svc := createService(t, c, ns, "web", port, target)
				writeSlice(t, c, ns, "web", "web-1", target, a.Endpoint(ready), b.Endpoint(ready), idle.Endpoint(notReady))
				c.WaitProgrammed(t, svc, port, a, b)

				res := c.Requests(t, cluster.TrafficOptions{Service: svc, Port: port, Protocol: tc.protocol, Count: 40})

				require.Len(t, res, 40)
				assert.Equal(t, 40, res.OK(), "%s", res)
				assert.Equal(t, []string{a.Key(), b.Key()}, res.Pods(), "%s", res)
				assert.Zero(t, idleSrv.Hits(), "the not-ready endpoint got connections through the Service")
				// The not-ready pod did listen: asked directly, it answers.
				direct := c.Requests(t, cluster.TrafficOptions{Address: idle.IP.String(), Port: target, Protocol: tc.protocol, Count: 1})
				assert.Equal(t, []string{idle.Key()}, direct.Pods(), "%s", direct)
			})
		}
	})

	// The traffic client leaves from addresses of its own (cluster.ClientSource), not from the
	// cluster namespace's address the agents probe from, and from another address for each
	// ClusterIP: a DNATed client connection whose reply tuple meets a probe's conntrack entry, or
	// one of a connection to another ClusterIP of the same pod, would lose every SYN (netns.go).
	t.Run("requests through the ClusterIP leave from the traffic client's address", func(t *testing.T) {
		ns := c.Env.CreateNamespaceForTest(t, "client")
		const port, target = 80, 8080
		a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "a", Node: "node-a"})
		var ln net.Listener
		require.NoError(t, a.InNetns(func() (err error) {
			ln, err = net.Listen("tcp4", net.JoinHostPort(a.IP.String(), strconv.Itoa(target)))
			return err
		}))
		t.Cleanup(func() { _ = ln.Close() })
		sources := make(chan string, 64)
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				sources <- conn.RemoteAddr().(*net.TCPAddr).IP.String()
				_, _ = fmt.Fprintln(conn, a.Key())
				_ = conn.Close()
			}
		}()
		// Two Services whose ClusterIPs kube-proxy DNATs to the same pod (as the demo's
		// mysql-db-read and mysql-db-write both reach the primary).
		var seen []string
		for _, name := range []string{"web", "web-alias"} {
			svc := createService(t, c, ns, name, port, target)
			writeSlice(t, c, ns, name, name+"-1", target, a.Endpoint(ready))
			c.WaitProgrammed(t, svc, port, a)
			ip, err := c.ClusterIPOf(t.Context(), svc, corev1.IPv4Protocol)
			require.NoError(t, err)
			want := cluster.ClientSource(netip.MustParseAddr(ip)).String()

			res := c.Requests(t, cluster.TrafficOptions{Service: svc, Port: port, Protocol: cluster.TCP, Count: 5})

			assert.Equal(t, 5, res.OK(), "%s", res)
			require.Len(t, sources, 5)
			for range 5 {
				assert.Equal(t, want, <-sources, "the source of a request through %s's ClusterIP", svc)
			}
			seen = append(seen, want)
		}
		assert.NotEqual(t, seen[0], seen[1], "the two ClusterIPs of one pod are dialled from different addresses")
		// A connection of this process that names no source (an agent's probe) still leaves
		// from the cluster namespace's own address.
		conn, err := net.DialTimeout("tcp4", net.JoinHostPort(a.IP.String(), strconv.Itoa(target)), 2*time.Second)
		require.NoError(t, err)
		_ = conn.Close()
		assert.NotContains(t, seen, <-sources, "a probe's source")
	})

	t.Run("an endpoint set to ready=false stops receiving new connections", func(t *testing.T) {
		ns := c.Env.CreateNamespaceForTest(t, "unready")
		const port, target = 7000, 7000
		a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "a", Node: "node-a"})
		b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "b", Node: "node-b"})
		a.ServeTCP(t, target)
		bSrv := b.ServeTCP(t, target)
		svc := createService(t, c, ns, "echo", port, target)
		writeSlice(t, c, ns, "echo", "echo-1", target, a.Endpoint(ready), b.Endpoint(ready))
		c.WaitProgrammed(t, svc, port, a, b)
		before := c.Requests(t, cluster.TrafficOptions{Service: svc, Port: port, Protocol: cluster.TCP, Count: 30})
		require.Equal(t, []string{a.Key(), b.Key()}, before.Pods(), "both endpoints must answer first: %s", before)
		// A connection to b through the ClusterIP, opened while b is ready.
		conn := dialUntil(t, c, svc, port, b.Key())

		writeSlice(t, c, ns, "echo", "echo-1", target, a.Endpoint(ready), b.Endpoint(notReady))
		c.WaitProgrammed(t, svc, port, a)
		hitsBefore := bSrv.Hits()
		after := c.Requests(t, cluster.TrafficOptions{Service: svc, Port: port, Protocol: cluster.TCP, Count: 30})

		assert.Equal(t, 30, after.OK(), "%s", after)
		assert.Equal(t, []string{a.Key()}, after.Pods(), "%s", after)
		assert.Equal(t, hitsBefore, bSrv.Hits(), "b accepted new connections after ready=false")
		// The established connection is not cut: b still echoes on it.
		assertEchoes(t, conn, "still here")
	})

	t.Run("a terminating serving endpoint receives traffic only when no ready endpoint is left", func(t *testing.T) {
		ns := c.Env.CreateNamespaceForTest(t, "terminating")
		const port, target = 80, 8080
		a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "a", Node: "node-a"})
		b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "b", Node: "node-b"})
		a.ServeHTTP(t, target)
		bSrv := b.ServeHTTP(t, target)
		b.MarkTerminating(t)
		svc := createService(t, c, ns, "web", port, target)

		writeSlice(t, c, ns, "web", "web-1", target, a.Endpoint(ready), b.Endpoint(terminating))
		c.WaitProgrammed(t, svc, port, a)
		withReady := c.Requests(t, cluster.TrafficOptions{Service: svc, Port: port, Count: 30})
		assert.Equal(t, []string{a.Key()}, withReady.Pods(), "%s", withReady)
		assert.Equal(t, 30, withReady.OK(), "%s", withReady)
		assert.Zero(t, bSrv.Hits(), "the terminating endpoint got traffic while a ready one existed")

		writeSlice(t, c, ns, "web", "web-1", target, a.Endpoint(notReady), b.Endpoint(terminating))
		c.WaitProgrammed(t, svc, port, b)
		fallback := c.Requests(t, cluster.TrafficOptions{Service: svc, Port: port, Count: 30})
		assert.Equal(t, []string{b.Key()}, fallback.Pods(), "%s", fallback)
		assert.Equal(t, 30, fallback.OK(), "%s", fallback)

		// Once it stops serving too, nobody gets traffic: kube-proxy rejects the connections.
		writeSlice(t, c, ns, "web", "web-1", target, a.Endpoint(notReady), b.Endpoint(gone))
		c.WaitProgrammed(t, svc, port)
		hitsBefore := bSrv.Hits()
		none := c.Requests(t, cluster.TrafficOptions{Service: svc, Port: port, Count: 5})
		assert.Len(t, none.Failed(), 5, "%s", none)
		assert.Equal(t, hitsBefore, bSrv.Hits())
	})

	t.Run("two slices for one Service port are merged by kube-proxy", func(t *testing.T) {
		ns := c.Env.CreateNamespaceForTest(t, "merge")
		const port, target = 80, 8080
		a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "a", Node: "node-a"})
		b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "b", Node: "node-b"})
		a.ServeHTTP(t, target)
		b.ServeHTTP(t, target)
		svc := createService(t, c, ns, "web", port, target)

		writeSlice(t, c, ns, "web", "web-node-a", target, a.Endpoint(ready))
		writeSlice(t, c, ns, "web", "web-node-b", target, b.Endpoint(ready))
		c.WaitProgrammed(t, svc, port, a, b)
		res := c.Requests(t, cluster.TrafficOptions{Service: svc, Port: port, Count: 40})

		assert.Equal(t, 40, res.OK(), "%s", res)
		assert.Equal(t, []string{a.Key(), b.Key()}, res.Pods(), "%s", res)
	})

	t.Run("with internalTrafficPolicy Local only the endpoints of kube-proxy's node get traffic", func(t *testing.T) {
		ns := c.Env.CreateNamespaceForTest(t, "local")
		const port, target = 80, 8080
		a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "a", Node: "node-a"})
		b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "b", Node: "node-b"})
		a.ServeHTTP(t, target)
		bSrv := b.ServeHTTP(t, target)
		svc := createService(t, c, ns, "web", port, target)
		writeSlice(t, c, ns, "web", "web-1", target, a.Endpoint(ready), b.Endpoint(ready))
		c.WaitProgrammed(t, svc, port, a, b)

		s := &corev1.Service{}
		require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "web"}, s))
		s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
		require.NoError(t, c.Env.Client.Update(t.Context(), s))
		c.WaitProgrammed(t, svc, port, a)
		hitsBefore := bSrv.Hits()
		res := c.Requests(t, cluster.TrafficOptions{Service: svc, Port: port, Count: 30})

		assert.Equal(t, 30, res.OK(), "%s", res)
		assert.Equal(t, []string{a.Key()}, res.Pods(), "kube-proxy acts as node-a: %s", res)
		assert.Equal(t, hitsBefore, bSrv.Hits())
	})

	t.Run("a stopped server fails requests and answers again after Start", func(t *testing.T) {
		ns := c.Env.CreateNamespaceForTest(t, "restart")
		const port, target = 80, 8080
		a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "a", Node: "node-a"})
		srv := a.ServeHTTP(t, target)
		svc := createService(t, c, ns, "web", port, target)
		writeSlice(t, c, ns, "web", "web-1", target, a.Endpoint(ready))
		c.WaitProgrammed(t, svc, port, a)

		srv.Stop()
		stopped := c.Requests(t, cluster.TrafficOptions{Service: svc, Port: port, Count: 3})
		require.NoError(t, srv.Start())
		srv.SetHTTPStatus(503)
		unhealthy := c.Requests(t, cluster.TrafficOptions{Service: svc, Port: port, Count: 3})
		srv.SetHTTPStatus(200)
		healthy := c.Requests(t, cluster.TrafficOptions{Service: svc, Port: port, Count: 3})

		assert.Len(t, stopped.Failed(), 3, "%s", stopped)
		assert.Len(t, unhealthy.Failed(), 3, "%s", unhealthy)
		assert.Equal(t, 503, unhealthy[0].Status)
		assert.Equal(t, a.Key(), unhealthy[0].Pod, "a failing reply still names the pod")
		assert.Equal(t, 3, healthy.OK(), "%s", healthy)
	})

	t.Run("a loop bounded by time stops by itself and can be stopped early", func(t *testing.T) {
		ns := c.Env.CreateNamespaceForTest(t, "loop")
		a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "a", Node: "node-a"})
		a.ServeHTTP(t, 8080)
		byTime := c.Traffic(t, cluster.TrafficOptions{Address: a.IP.String(), Port: 8080, Duration: 2 * time.Second, Interval: 50 * time.Millisecond})
		long := c.Traffic(t, cluster.TrafficOptions{Address: a.IP.String(), Port: 8080, Duration: time.Hour, Interval: 20 * time.Millisecond})

		res := byTime.Wait()
		require.Eventually(t, func() bool { return len(long.Results()) > 0 }, 10*time.Second, 10*time.Millisecond)
		stopped := long.Stop()

		require.NotEmpty(t, res)
		assert.Equal(t, len(res), res.OK(), "%s", res)
		assert.Less(t, res[len(res)-1].Start.Sub(res[0].Start), 2*time.Second, "no request starts after the loop's duration")
		assert.NotEmpty(t, stopped)
	})
}

// TestPodsAreNetworkNamespacesWithObjects checks the Pod and Node objects the harness writes and
// the pods' network namespaces.
func TestPodsAreNetworkNamespacesWithObjects(t *testing.T) {
	c := cluster.Start(t, cluster.Options{Nodes: twoZones})

	t.Run("pod and node objects look like a kubelet wrote them", func(t *testing.T) {
		ns := c.Env.CreateNamespaceForTest(t, "objects")
		p := c.AddPod(t, cluster.PodSpec{
			Namespace: ns, Name: "db-0", Node: "node-b", Labels: map[string]string{"app": "db"},
			ContainerPorts: []corev1.ContainerPort{{Name: "pg", ContainerPort: 5432}},
		})

		pod, err := p.Object(t.Context())
		require.NoError(t, err)
		assert.Equal(t, "node-b", pod.Spec.NodeName)
		assert.Equal(t, "db", pod.Labels["app"])
		assert.Equal(t, int32(5432), pod.Spec.Containers[0].Ports[0].ContainerPort)
		assert.Equal(t, corev1.PodRunning, pod.Status.Phase)
		assert.Equal(t, p.IP.String(), pod.Status.PodIP)
		assert.Equal(t, []corev1.PodIP{{IP: p.IP.String()}}, pod.Status.PodIPs)
		assert.Equal(t, c.Node("node-b").IP.String(), pod.Status.HostIP)
		assert.NotNil(t, pod.Status.StartTime)
		assert.Equal(t, corev1.ConditionTrue, condition(pod, corev1.PodReady))
		assert.True(t, pod.Status.ContainerStatuses[0].Ready)
		assert.True(t, netip.MustParsePrefix(cluster.PodCIDR).Contains(p.IP), "pod address %s outside %s", p.IP, cluster.PodCIDR)

		node := &corev1.Node{}
		require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKey{Name: "node-b"}, node))
		assert.Equal(t, "zone-b", node.Labels[corev1.LabelTopologyZone])
		assert.Equal(t, []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: c.Node("node-b").IP.String()},
			{Type: corev1.NodeHostName, Address: "node-b"},
		}, node.Status.Addresses)

		objectOnly := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "db-1", Node: "node-a", ObjectOnly: true})
		onlyObj, err := objectOnly.Object(t.Context())
		require.NoError(t, err)
		assert.Equal(t, objectOnly.IP.String(), onlyObj.Status.PodIP)
		assert.Empty(t, objectOnly.Netns, "an object-only pod has no network namespace")
		assert.NotEqual(t, p.IP, objectOnly.IP)

		p.SetReady(t, false)
		pod, err = p.Object(t.Context())
		require.NoError(t, err)
		assert.Equal(t, corev1.ConditionFalse, condition(pod, corev1.PodReady))
		assert.Equal(t, corev1.ConditionFalse, condition(pod, corev1.ContainersReady))
		assert.False(t, pod.Status.ContainerStatuses[0].Ready)

		p.MarkTerminating(t)
		pod, err = p.Object(t.Context())
		require.NoError(t, err)
		assert.NotNil(t, pod.DeletionTimestamp)
		_, err = os.Stat(p.NetnsPath())
		assert.NoError(t, err, "a terminating pod keeps its network")

		p.Delete(t)
		_, err = p.Object(t.Context())
		assert.True(t, apierrors.IsNotFound(err), "the Pod object must be gone: %v", err)
		_, err = os.Stat(p.NetnsPath())
		assert.True(t, os.IsNotExist(err), "the network namespace must be gone: %v", err)
	})

	t.Run("a process runs inside the pod's network namespace", func(t *testing.T) {
		ns := c.Env.CreateNamespaceForTest(t, "process")
		p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "shell", Node: "node-a"})
		out := &strings.Builder{}
		cmd := p.Command("ip", "-o", "-4", "addr", "show", "dev", "eth0")
		cmd.Stdout = out
		require.NoError(t, cmd.Run())
		assert.Contains(t, out.String(), p.IP.String()+"/32")

		// A client socket made inside the pod comes from the pod's address.
		srv := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "server", Node: "node-b"})
		srv.ServeTCP(t, 9000)
		var conn net.Conn
		require.NoError(t, p.InNetns(func() error {
			var err error
			conn, err = net.DialTimeout("tcp", srv.IP.String()+":9000", 5*time.Second)
			return err
		}))
		defer func() { _ = conn.Close() }()
		assert.Equal(t, p.IP.String(), conn.LocalAddr().(*net.TCPAddr).IP.String())
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		greeting, err := bufio.NewReader(conn).ReadString('\n')
		require.NoError(t, err)
		assert.Equal(t, srv.Key()+"\n", greeting)
		assertEchoes(t, conn, "from pod to pod")

		// A long-running process lives in the pod's network namespace and stops on request.
		sleeper := p.Run(t, "sleep", "600")
		podNS := &syscall.Stat_t{}
		require.NoError(t, syscall.Stat(p.NetnsPath(), podNS))
		// nsenter joins the namespace, then becomes sleep (same PID).
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			exe, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(sleeper.Process.Pid), "exe"))
			require.NoError(c, err)
			assert.Equal(c, "sleep", filepath.Base(exe))
			nsLink, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(sleeper.Process.Pid), "ns", "net"))
			require.NoError(c, err)
			assert.Equal(c, fmt.Sprintf("net:[%d]", podNS.Ino), nsLink)
		}, 10*time.Second, 10*time.Millisecond)
		p.StopProcess(sleeper)
		assert.Error(t, syscall.Kill(sleeper.Process.Pid, 0), "the process must be gone")
	})
}

// TestNothingIsLeftBehind checks that a cluster removes what it made when it stops.
func TestNothingIsLeftBehind(t *testing.T) {
	cluster.SkipUnlessIsolated(t)
	require.Empty(t, cluster.Leftovers(), "clean before the test")
	var netns, link string
	var kubeProxyPID, processPID int
	t.Run("a cluster with kube-proxy, pods, servers and a process", func(t *testing.T) {
		c := cluster.Start(t, cluster.Options{KubeProxy: true})
		ns := c.Env.CreateNamespaceForTest(t, "leftovers")
		p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "a"})
		p.ServeHTTP(t, 8080)
		p.ServeTCP(t, 9000)
		processPID = p.Run(t, "sleep", "600").Process.Pid
		netns, link, kubeProxyPID = p.Netns, p.HostLink, c.KubeProxyPID()
		// While it runs, all of it exists.
		require.NotEmpty(t, cluster.Leftovers())
		_, err := os.Stat(p.NetnsPath())
		require.NoError(t, err)
		require.NoError(t, syscall.Kill(kubeProxyPID, 0))
		require.NoError(t, syscall.Kill(processPID, 0))
	})

	assert.Empty(t, cluster.Leftovers())
	_, err := os.Stat(filepath.Join("/run/netns", netns))
	assert.True(t, os.IsNotExist(err), "network namespace %s is left: %v", netns, err)
	_, err = net.InterfaceByName(link)
	assert.Error(t, err, "link %s is left", link)
	assert.Error(t, syscall.Kill(kubeProxyPID, 0), "kube-proxy is still running")
	assert.Error(t, syscall.Kill(processPID, 0), "the pod's process is still running")
}

// serve starts the protocol's server on the pod.
func serve(t *testing.T, p *cluster.Pod, proto cluster.Protocol, port int) *cluster.Server {
	t.Helper()
	switch proto {
	case cluster.TCP:
		return p.ServeTCP(t, port)
	case cluster.SMTP:
		return p.ServeSMTP(t, port)
	default:
		return p.ServeHTTP(t, port)
	}
}

// dialUntil opens TCP connections through the Service until one lands on the pod and returns it.
func dialUntil(t *testing.T, c *cluster.Cluster, svc string, port int32, pod string) net.Conn {
	t.Helper()
	key := strings.SplitN(svc, "/", 2)
	s := &corev1.Service{}
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: key[0], Name: key[1]}, s))
	addr := net.JoinHostPort(s.Spec.ClusterIP, strconv.Itoa(int(port)))
	var conn net.Conn
	require.Eventually(t, func() bool {
		cn, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return false
		}
		_ = cn.SetReadDeadline(time.Now().Add(2 * time.Second))
		line, err := bufio.NewReader(cn).ReadString('\n')
		if err != nil || strings.TrimSpace(line) != pod {
			_ = cn.Close()
			return false
		}
		conn = cn
		return true
	}, 30*time.Second, time.Millisecond)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func assertEchoes(t *testing.T, conn net.Conn, msg string) {
	t.Helper()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	_, err := io.WriteString(conn, msg+"\n")
	require.NoError(t, err)
	buf := make([]byte, len(msg)+1)
	_, err = io.ReadFull(conn, buf)
	require.NoError(t, err)
	assert.Equal(t, msg+"\n", string(buf))
}

func condition(pod *corev1.Pod, typ corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range pod.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}
