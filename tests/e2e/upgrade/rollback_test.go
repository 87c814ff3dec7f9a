// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package upgrade_test

import (
	"net"
	"slices"
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
	"github.com/deckhouse/service-with-healthchecks/testkit/grpchealth"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// grpcField is the CRD field of the GRPC probe mode: a release whose CRD lacks it does not know
// the mode.
const grpcField = "v1alpha1:spec.healthcheck.probes[].grpc"

// TestRollbackToAReleaseWithoutTheGRPCModeAndThePlatformOperatorsWay starts HEAD (its CRD,
// chart RBAC and policies, programs as their ServiceAccounts) with a resource whose pods serve
// HTTP on 8080 (port web, HTTP probe) and gRPC health on 9090 (port grpc, GRPC probe), and a
// request loop through web's ClusterIP. Then, with the oldest release that lacks the GRPC mode
// (docs/UPGRADE.md, "From v0.2.0 back to v0.1.0"):
//
//  1. a rollback with the GRPC probe in place: the older agent publishes every port of every pod
//     not ready — web too, whose own HTTP probe passes — and the loop fails (what the document
//     warns of, observed);
//  2. upgraded again and the GRPC probe written back, the documented way: the GRPC probe
//     replaced by a TCP probe on the same port while HEAD runs, then the rollback: zero failed
//     requests from the start of the rollback until one agentLostGrace after it, and every pod
//     ready on both ports after it.
func TestRollbackToAReleaseWithoutTheGRPCModeAndThePlatformOperatorsWay(t *testing.T) {
	cluster.SkipUnlessIsolated(t)
	all := sources(t)
	prev := all[len(all)-1]
	old, head := versions(t, prev)
	if !slices.Contains(addedSpecFields(t, old.CRD, head.CRD), grpcField) {
		t.Skipf("the oldest release v%s knows the GRPC probe mode: no release to roll back to lacks it", prev.Version)
	}
	tm := e2e.Timing{PeriodSeconds: 1, FailureThreshold: 2, MinInWindow: minInWindow, WaitFor: 2 * time.Minute, Poll: 100 * time.Millisecond}

	c := cluster.Start(t, cluster.Options{
		Nodes:        []cluster.Node{{Name: "node-a", Zone: "zone-a"}, {Name: "node-b", Zone: "zone-b"}},
		KubeProxy:    true,
		ControlPlane: controlplane.Options{SkipModuleCRDs: true, ExtraCRDPaths: []string{head.CRD}},
	})
	applyAccess(t, c, head.Access, nil)
	waitPoliciesInForce(t, c, head.Access)
	kubeconfigs := programKubeconfigs(t, c, stack.DefaultControllers)
	s := stack.Start(t, stack.Options{Cluster: c, Binaries: &head.Bins, ControllerArgs: head.ControllerArgs, AgentArgs: head.AgentArgs,
		Kubeconfigs: func(program string) string { return kubeconfigs[program] }})
	ctx := t.Context()
	ns := c.Env.CreateNamespaceForTest(t, "rollback-grpc")
	var pods []*cluster.Pod
	for _, n := range c.Nodes {
		p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "app-" + n.Name, Node: n.Name, Labels: map[string]string{"app": "app"},
			ContainerPorts: []corev1.ContainerPort{{Name: "web", ContainerPort: 8080}, {Name: "grpc", ContainerPort: 9090}}})
		p.ServeHTTP(t, 8080)
		serveGRPCHealth(t, p)
		pods = append(pods, p)
	}
	grpcProbe := v1alpha1.Probe{Mode: v1alpha1.ProbeModeGRPC, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: tm.FailureThreshold,
		GRPC: &v1alpha1.GRPCProbe{TargetPort: intstr.FromInt32(9090)}}
	ports := []v1alpha1.ServicePort{e2e.ServicePort("web", 80, intstr.FromInt32(8080)), e2e.ServicePort("grpc", 9090, intstr.FromInt32(9090))}
	res := tm.Resource(ns, "app", map[string]string{"app": "app"}, ports, tm.HTTPProbe(intstr.FromInt32(8080)), grpcProbe)
	require.NoError(t, c.Env.Client.Create(ctx, res))
	requireAllEndpoints(t, tm, c, ns, pods, "TTF")
	c.WaitProgrammed(t, ns+"/app", 80, pods...)

	loop := c.Traffic(t, cluster.TrafficOptions{Service: ns + "/app", Port: 80, Protocol: cluster.HTTP, Duration: loopFor})
	waitAfter(t, map[string]*cluster.Traffic{"web": loop}, time.Now())

	// 1. The rollback the document warns of. The older agent runs only the HTTP probe (one
	// target per node): the GRPC probe is not runnable there.
	bad := replace(t, s, "rollback to v"+prev.Version+" with a GRPC probe", old, head, 1)
	requireAllEndpoints(t, tm, c, ns, pods, "FFF")
	waitAfter(t, map[string]*cluster.Traffic{"web": loop}, time.Now())
	failedBad := loop.Results().Since(bad.From).Failed()
	assert.NotEmpty(t, failedBad, "v%s takes the pods of a resource with a GRPC probe out of traffic, web included", prev.Version)
	t.Logf("rollback with the GRPC probe: %d failed requests on web from %s", len(failedBad), bad.From.Format("15:04:05.000"))

	// 2. Back to HEAD, the GRPC probe written again (the older controller's status writes
	// dropped its section), then the documented way.
	replace(t, s, "upgrade to HEAD again", head, old, 1)
	setProbes(t, c, ns, "app", tm.HTTPProbe(intstr.FromInt32(8080)), grpcProbe)
	requireAllEndpoints(t, tm, c, ns, pods, "TTF")
	c.WaitProgrammed(t, ns+"/app", 80, pods...)
	waitAfter(t, map[string]*cluster.Traffic{"web": loop}, time.Now())
	setProbes(t, c, ns, "app", tm.HTTPProbe(intstr.FromInt32(8080)), tm.TCPProbe(intstr.FromInt32(9090)))
	requireAllEndpoints(t, tm, c, ns, pods, "TTF")
	good := replace(t, s, "rollback to v"+prev.Version+" after replacing the GRPC probe by TCP", old, head, 2)
	waitAfter(t, map[string]*cluster.Traffic{"web": loop}, good.To.Add(agentLostGrace))
	requireAllEndpoints(t, tm, c, ns, pods, "TTF")
	results := loop.Stop()
	in := tm.RequireWindow(t, results, "web "+good.Name, good.From, good.To.Add(agentLostGrace))
	assert.Empty(t, in.Failed(), "web: failed requests during the %s: %s", good.Name, e2e.Failures(in))
	assert.Len(t, in.ByPod(), len(pods), "web: every pod answered during the %s: %v", good.Name, in.ByPod())
	t.Logf("web during the %s: %s", good.Name, in)
}

// serveGRPCHealth starts a gRPC health server on port 9090 of the pod (its listener is made in
// the pod's network namespace), serving.
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

// setProbes writes the resource's probes (HEAD's API, under HEAD's CRD).
func setProbes(t *testing.T, c *cluster.Cluster, ns, name string, probes ...v1alpha1.Probe) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		var r v1alpha1.ServiceWithHealthchecks
		require.NoError(ct, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &r))
		r.Spec.Healthcheck.Probes = probes
		require.NoError(ct, c.Env.Client.Update(t.Context(), &r))
	}, kit.WaitFor, kit.Poll, "writing the probes of %s/%s", ns, name)
}

// requireAllEndpoints waits until every pod is listed on both ports of the resource "app" with
// the conditions want ("RST", e2e.Conds) and nothing else is listed.
func requireAllEndpoints(t *testing.T, tm e2e.Timing, c *cluster.Cluster, ns string, pods []*cluster.Pod, want string) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		slicesOf, err := e2e.EndpointsOf(t.Context(), c, ns, "app")
		require.NoError(ct, err)
		seen := map[string]int{}
		for name, eps := range slicesOf {
			for addr, conds := range eps {
				assert.Equal(ct, want, conds, "%s in %s", addr, name)
				seen[addr]++
			}
		}
		for _, p := range pods {
			assert.Equal(ct, 2, seen[p.IP.String()], "%s is listed on both ports", p.Key())
		}
	}, tm.WaitFor, tm.Poll, "every pod %s on both ports", want)
}
