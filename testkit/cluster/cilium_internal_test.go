// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// TestCiliumSocketLBSeesOnlyTheTestBinarysCgroup shows where Cilium's socket load balancer
// acts: a process of this test binary (in the sub-cgroup the agent attached to) reaches the
// pod through the ClusterIP, the same command moved to the hierarchy's root (where every other
// process of the machine is) is not translated (no kube-proxy runs: the packet follows the
// default route to nowhere), and the agent's pins live in its own bpffs, not the machine's.
func TestCiliumSocketLBSeesOnlyTheTestBinarysCgroup(t *testing.T) {
	if !CiliumEnabled() {
		t.Skipf("the Cilium dataplane runs in `make test-cilium` (%s=1)", CiliumEnv)
	}
	c := Start(t, Options{Cilium: true})
	ns := c.Env.CreateNamespaceForTest(t, "socketlb")
	const port = 7000
	a := c.AddPod(t, PodSpec{Namespace: ns, Name: "a", Node: "node-a"})
	a.ServeTCP(t, port)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "echo"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: "main", Port: port, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(port),
		}}},
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), svc))
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "echo-1", Labels: map[string]string{
			discoveryv1.LabelServiceName: "echo", discoveryv1.LabelManagedBy: "testkit-cluster-test",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{a.Endpoint(discoveryv1.EndpointConditions{Ready: ptr.To(true)})},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("main"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), slice))
	require.NotEmpty(t, svc.Spec.ClusterIP)
	c.WaitProgrammed(t, ns+"/echo", port, a)
	addr := net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(port))
	// bash's /dev/tcp: one connection, the first line (the TCP server's greeting names the pod).
	dial := "exec 3<>/dev/tcp/" + strings.ReplaceAll(addr, ":", "/") + " && head -n 1 <&3"

	inside, err := exec.Command("timeout", "5", "bash", "-c", dial).CombinedOutput()
	require.NoError(t, err, "from the test binary's cgroup: %s", inside)
	assert.Equal(t, a.Key(), strings.TrimSpace(string(inside)), "a process of the test binary reaches the pod through the ClusterIP")

	root := filepath.Join(c.cilium.cgroupRoot, "cgroup.procs")
	outside, err := exec.Command("bash", "-c", `echo $$ > "$1" && exec timeout 3 bash -c "$2"`, "sh", root, dial).CombinedOutput()
	require.Error(t, err, "from the root cgroup the ClusterIP must not be translated: %s", outside)
	assert.NotContains(t, string(outside), a.Key())

	// The agent's pins are in the bpffs of its own mount namespace: this process's /sys/fs/bpf
	// (the isolated binary's fresh sysfs) holds none of them.
	entries, err := os.ReadDir("/sys/fs/bpf")
	if err == nil {
		assert.Empty(t, entries, "nothing pinned outside the agent's mount namespace")
	}
	pins, err := c.cilium.dbgInAgent(t.Context(), "bpf", "lb", "list")
	require.NoError(t, err)
	assert.Contains(t, string(pins), addr, "the agent's own bpffs holds the service map")
}
