// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package realnode_test runs the product's edge cases on a real node: a kubelet and containerd
// (testkit/realnode) whose pods are real containers of locally built images, registered with a
// node client certificate against an API server with the Node authorizer and NodeRestriction,
// the product's programs (testkit/stack) with an agent for the real node, and the harness's
// real kube-proxy in front. See development/E2E.md ("Real nodes").
package realnode_test

import (
	"fmt"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
	"github.com/deckhouse/service-with-healthchecks/testkit/realnode"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

func TestMain(m *testing.M) { cluster.RunIsolated(m) }

const (
	// nodeName is the real node; it runs in the cluster namespace, whose own address
	// (198.19.0.1, where the API server advertises itself) is its InternalIP.
	nodeName = "real-a"
	nodeIP   = "198.19.0.1"
)

// tm is the suite's timing: probes every second, two failures to fail, waits of a minute.
var tm = e2e.Timing{PeriodSeconds: 1, FailureThreshold: 2, MinInWindow: 20, WaitFor: 2 * time.Minute, Poll: 100 * time.Millisecond}

// nodeA is the first real node; nodeB a second one, on another address of the cluster namespace
// (realStack adds it to lo) with its own bridge and pod range.
var (
	nodeA = realnode.Spec{Name: nodeName, NodeIP: nodeIP, PodCIDR: "198.18.200.0/24", Bridge: "swhcni0"}
	nodeB = realnode.Spec{Name: "real-b", NodeIP: "198.19.0.2", PodCIDR: "198.18.201.0/24", Bridge: "swhcni1"}
)

// realStack is a cluster (API server with the Node authorizer and NodeRestriction, kube-proxy),
// real nodes (default nodeA), the product with an agent for each, and the built-in Deployment
// and ReplicaSet controllers (kube-controller-manager); all stopped when the test ends. It
// returns the first node.
func realStack(t *testing.T, specs ...realnode.Spec) (*stack.Stack, *realnode.Node) {
	t.Helper()
	realnode.SkipUnlessEnabled(t)
	if len(specs) == 0 {
		specs = []realnode.Spec{nodeA}
	}
	c := cluster.Start(t, cluster.Options{
		KubeProxy: true,
		ControlPlane: controlplane.Options{APIServerFlags: map[string]string{
			"authorization-mode":       "Node,RBAC",
			"enable-admission-plugins": "NodeRestriction",
		}},
	})
	var nodes []*realnode.Node
	var names []string
	for _, spec := range specs {
		if spec.NodeIP != nodeIP {
			addr := spec.NodeIP + "/32"
			out, err := exec.Command("ip", "addr", "add", addr, "dev", "lo").CombinedOutput()
			require.NoError(t, err, "%s", out)
			t.Cleanup(func() {
				if out, err := exec.Command("ip", "addr", "del", addr, "dev", "lo").CombinedOutput(); err != nil {
					t.Errorf("removing %s from lo: %v: %s", addr, err, out)
				}
			})
		}
		nodes = append(nodes, realnode.StartForTest(t, c.Env, spec))
		names = append(names, spec.Name)
	}
	s := stack.Start(t, stack.Options{Cluster: c, AgentNodes: names})
	bin, err := controlplane.Binary("kube-controller-manager")
	require.NoError(t, err)
	cmd := exec.Command(bin, "--kubeconfig="+s.Kubeconfig, //nolint:gosec // the pinned tool binary
		"--controllers=deployment-controller,replicaset-controller", "--leader-elect=false", "--secure-port=0")
	process.StartForTest(t, "kube-controller-manager", cmd)
	return s, nodes[0]
}

// TestRealNodeRegistersReadyAndRunsAPod: the kubelet registers its Node with its node
// certificate, runs a pod of the local server image through containerd, runc and the CNI
// bridge, and the pod answers on its IP with its name.
func TestRealNodeRegistersReadyAndRunsAPod(t *testing.T) {
	realnode.SkipUnlessEnabled(t)
	c := cluster.Start(t, cluster.Options{
		ControlPlane: controlplane.Options{APIServerFlags: map[string]string{
			"authorization-mode":       "Node,RBAC",
			"enable-admission-plugins": "NodeRestriction",
		}},
	})
	realnode.StartForTest(t, c.Env, nodeA)
	ns := c.Env.CreateNamespaceForTest(t, "realnode")
	pod := &corev1.Pod{Spec: podSpec("1")}
	pod.Namespace, pod.Name = ns, "web"
	require.NoError(t, c.Env.Client.Create(t.Context(), pod))
	ip := waitRunning(t, c, pod)
	status, who, err := get(t.Context(), fmt.Sprintf("http://%s:8080/", ip))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, ns+"/web", who)
}

// TestRealNodeRollingUpdate: a Deployment's rolling update on the real node (kubelet
// readiness gating the rollout, SIGTERM with a drain delay for the old pods) under a request
// loop through the Service's ClusterIP and kube-proxy: 0 failed requests, and afterwards every
// request answered by a new pod.
func TestRealNodeRollingUpdate(t *testing.T) {
	s, _ := realStack(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "rollout")
	require.NoError(t, s.Apply(t.Context(), ns, webResource(ns), deployment(ns, "1")))
	old := waitPods(t, c, ns, "1", 2)
	waitProgrammed(t, c, ns+"/web", 80, endpoints(old, 8080))

	loop := webTraffic(t, c, ns)
	from := time.Now()
	require.NoError(t, s.Apply(t.Context(), ns, deployment(ns, "2")))
	fresh := waitPods(t, c, ns, "2", 2)
	waitProgrammed(t, c, ns+"/web", 80, endpoints(fresh, 8080))
	to := time.Now()
	tm.WaitRequestsAfter(t, loop, to, tm.MinInWindow)
	res := loop.Stop()

	in := tm.RequireWindow(t, res, "rolling update", from, to)
	require.Empty(t, res.Failed(), "failed requests: %s", e2e.Failures(res))
	require.NotEmpty(t, in.OK())
	var names []string
	for _, p := range fresh {
		names = append(names, ns+"/"+p.Name)
	}
	for _, r := range res.Since(to) {
		require.Contains(t, names, r.Pod, "a request after the rollout was answered by an old pod")
	}
}

// TestRealNodeReadinessFailsWhilePerPortProbePasses: the kubelet's readiness probe fails (the
// pod goes NotReady) while the product's per-port probe of port http still passes. The probed
// port keeps its endpoint (0 failed requests through it), the unprobed port admin follows the
// pod's readiness and loses it; both come back when readiness does.
func TestRealNodeReadinessFailsWhilePerPortProbePasses(t *testing.T) {
	s, _ := realStack(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "readiness")
	require.NoError(t, s.Apply(t.Context(), ns, webResource(ns), deployment(ns, "1")))
	pods := waitPods(t, c, ns, "1", 2)
	waitProgrammed(t, c, ns+"/web", 80, endpoints(pods, 8080))
	waitProgrammed(t, c, ns+"/web", 81, endpoints(pods, 8081))

	loop := webTraffic(t, c, ns)
	from := time.Now()
	flipped := pods[0]
	control(t, flipped.Status.PodIP, "unready")
	require.Eventually(t, func() bool {
		var p corev1.Pod
		return c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(&flipped), &p) == nil && !podReady(&p)
	}, tm.WaitFor, tm.Poll, "the kubelet did not mark %s NotReady", flipped.Name)
	waitProgrammed(t, c, ns+"/web", 81, endpoints(pods[1:], 8081))
	require.Equal(t, endpoints(pods, 8080), programmed(t, c, ns+"/web", 80),
		"the probed port keeps the NotReady pod whose per-port probe passes")
	control(t, flipped.Status.PodIP, "ready")
	waitProgrammed(t, c, ns+"/web", 81, endpoints(pods, 8081))
	to := time.Now()
	tm.WaitRequestsAfter(t, loop, to, tm.MinInWindow)
	res := loop.Stop()

	in := tm.RequireWindow(t, res, "readiness flip", from, to)
	require.Empty(t, res.Failed(), "failed requests: %s", e2e.Failures(res))
	assert.Contains(t, in.Pods(), ns+"/"+flipped.Name, "the NotReady pod kept serving the probed port")
}

// webResource is the resource in front of the Deployment: port 80 -> http, probed over HTTP;
// port 81 -> admin, not probed (it follows the pod's readiness).
func webResource(ns string) *v1alpha1.ServiceWithHealthchecks {
	return tm.Resource(ns, "web", map[string]string{"app": "web"},
		[]v1alpha1.ServicePort{
			e2e.ServicePort("http", 80, intstr.FromString("http")),
			e2e.ServicePort("admin", 81, intstr.FromString("admin")),
		},
		tm.HTTPProbe(intstr.FromString("http")))
}
