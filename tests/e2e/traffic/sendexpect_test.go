// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import (
	"io"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// steps makes a TCP probe on port with a send/expect dialogue.
func steps(port intstr.IntOrString, st ...v1alpha1.TCPStep) v1alpha1.Probe {
	p := kit.TCPProbe(port)
	p.TCP.Steps = st
	return p
}

// A wedged SMTP daemon accepts connections and never greets. The connect-only probe keeps it;
// the banner check (expect prefix "220") withdraws it from smtp, while web requests to the same
// pod through the same ClusterIP go on with zero failures, and it comes back when it greets again.
func TestSendExpectBannerCheckWithdrawsAWedgedSMTPServer(t *testing.T) {
	s := testStack(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "sendexpect-smtp")
	labels := map[string]string{"vm": "mail-1"}
	vm := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "vm-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	vm.ServeHTTP(t, 8080)
	smtp := vm.ServeSMTP(t, 2525)
	banner := steps(intstr.FromString("smtp"), v1alpha1.TCPStep{Expect: &v1alpha1.TCPExpect{Prefix: "220"}})
	createResource(t, c, kit.Resource(ns, "mail", labels,
		[]v1alpha1.ServicePort{e2e.ServicePort("web", 80, intstr.FromString("web")), e2e.ServicePort("smtp", 25, intstr.FromInt32(2525))},
		kit.HTTPProbe(intstr.FromInt32(8080)), banner))
	createResource(t, c, kit.Resource(ns, "connect", labels,
		[]v1alpha1.ServicePort{e2e.ServicePort("smtp", 25, intstr.FromInt32(2525))}, kit.TCPProbe(intstr.FromString("smtp"))))
	healthy := map[string]map[string]string{"mail-web-node-a": {ip(vm): "TTF"}, "mail-smtp-node-a": {ip(vm): "TTF"}}
	kit.EventuallyEndpoints(t, c, ns, "mail", healthy)
	kit.EventuallyEndpoints(t, c, ns, "connect", map[string]map[string]string{"connect-smtp-node-a": {ip(vm): "TTF"}})
	c.WaitProgrammed(t, ns+"/mail", 80, vm)
	c.WaitProgrammed(t, ns+"/mail", 25, vm)

	loop := c.Traffic(t, cluster.TrafficOptions{Service: ns + "/mail", Port: 80, Duration: loopFor})
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)
	wedged := time.Now()
	smtp.SetWedged(true)
	kit.EventuallyEndpoints(t, c, ns, "mail", map[string]map[string]string{"mail-web-node-a": {ip(vm): "TTF"}, "mail-smtp-node-a": {ip(vm): "FFF"}})
	c.WaitProgrammed(t, ns+"/mail", 25)
	// The connect-only resource still publishes the wedged server: a connect is all it checks.
	kit.EventuallyEndpoints(t, c, ns, "connect", map[string]map[string]string{"connect-smtp-node-a": {ip(vm): "TTF"}})
	c.WaitProgrammed(t, ns+"/connect", 25, vm)
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)

	smtp.SetWedged(false)
	kit.EventuallyEndpoints(t, c, ns, "mail", healthy)
	c.WaitProgrammed(t, ns+"/mail", 25, vm)
	back := time.Now()
	kit.WaitRequestsAfter(t, loop, back, minInWindow)
	res := loop.Stop()
	kit.RequireWindow(t, res, "from SMTP wedged to SMTP greeting again", wedged, back)
	assert.Empty(t, res.Failed(), "web requests to the VM while its SMTP was wedged: %s; failed: %s", res, e2e.Failures(res))
	after := c.Requests(t, cluster.TrafficOptions{Service: ns + "/mail", Port: 25, Protocol: cluster.SMTP, Count: 10})
	assert.Equal(t, map[string]int{vm.Key(): 10}, after.ByPod(), "SMTP through the ClusterIP works again: %s", after)
}

// redisPod runs a real redis-server in a pod on port 6379 (extra arguments appended).
func redisPod(t *testing.T, c *cluster.Cluster, ns, name, node string, labels map[string]string, args ...string) *cluster.Pod {
	t.Helper()
	p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: name, Node: node, Labels: labels,
		ContainerPorts: []corev1.ContainerPort{{Name: "redis", ContainerPort: 6379, Protocol: corev1.ProtocolTCP}}})
	p.Run(t, "redis-server", append([]string{"--port", "6379", "--bind", "*", "--protected-mode", "no", "--dir", t.TempDir(),
		"--save", "", "--appendonly", "no", "--daemonize", "no"}, args...)...)
	return p
}

var roleLine = regexp.MustCompile(`(?m)^role:(\w+)\r$`)

// redisRoles asks the Service's ClusterIP n times, each on a new connection (kube-proxy picks an
// endpoint for each), for its replication role; "" for a connection that failed.
func redisRoles(t *testing.T, c *cluster.Cluster, ns, name string, n int) []string {
	t.Helper()
	svc := &corev1.Service{}
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, svc))
	addr := net.JoinHostPort(svc.Spec.ClusterIP, "6379")
	roles := make([]string, n)
	for i := range roles {
		conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			t.Logf("request %d to %s: %v", i, name, err)
			continue
		}
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		_, _ = io.WriteString(conn, "INFO replication\r\nQUIT\r\n")
		reply, _ := io.ReadAll(io.LimitReader(conn, 64<<10))
		_ = conn.Close()
		if m := roleLine.FindSubmatch(reply); m != nil {
			roles[i] = string(m[1])
		}
	}
	return roles
}

// A real Redis primary and its replica: redis-write (INFO replication → role:master) publishes
// the primary only, and every request through its ClusterIP reaches the primary; redis-read
// (PING → +PONG) publishes both.
func TestSendExpectRedisWriteFollowsTheMaster(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skipf("needs redis-server (make deps installs the Debian package redis-server): %v", err)
	}
	s := testStack(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "sendexpect-redis")
	labels := map[string]string{"app": "redis"}
	primary := redisPod(t, c, ns, "redis-0", "node-a", labels)
	replica := redisPod(t, c, ns, "redis-1", "node-b", labels, "--replicaof", ip(primary), strconv.Itoa(6379))
	ports := []v1alpha1.ServicePort{e2e.ServicePort("redis", 6379, intstr.FromString("redis"))}
	master := steps(intstr.FromString("redis"),
		v1alpha1.TCPStep{Send: `INFO replication\r\nQUIT\r\n`}, v1alpha1.TCPStep{Expect: &v1alpha1.TCPExpect{Regex: `(?m)^role:master\r$`}})
	pong := steps(intstr.FromString("redis"), v1alpha1.TCPStep{Send: `PING\r\n`}, v1alpha1.TCPStep{Expect: &v1alpha1.TCPExpect{Prefix: `+PONG\r\n`}})
	createResource(t, c, kit.Resource(ns, "redis-write", labels, ports, master))
	createResource(t, c, kit.Resource(ns, "redis-read", labels, ports, pong))
	kit.EventuallyEndpoints(t, c, ns, "redis-write", map[string]map[string]string{
		"redis-write-redis-node-a": {ip(primary): "TTF"}, "redis-write-redis-node-b": {ip(replica): "FFF"}})
	kit.EventuallyEndpoints(t, c, ns, "redis-read", map[string]map[string]string{
		"redis-read-redis-node-a": {ip(primary): "TTF"}, "redis-read-redis-node-b": {ip(replica): "TTF"}})
	c.WaitProgrammed(t, ns+"/redis-write", 6379, primary)
	c.WaitProgrammed(t, ns+"/redis-read", 6379, primary, replica)

	for i, role := range redisRoles(t, c, ns, "redis-write", 20) {
		assert.Equal(t, "master", role, "request %d through redis-write reaches the primary", i)
	}
	seen := map[string]int{}
	for i, role := range redisRoles(t, c, ns, "redis-read", 20) {
		assert.Contains(t, []string{"master", "slave"}, role, "request %d through redis-read is answered", i)
		seen[role]++
	}
	t.Logf("redis-read answered by role: %v", seen)
}
