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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/grpchealth"
	"github.com/deckhouse/service-with-healthchecks/testkit/mariadb"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// The CRD fields of the GRPC and MySQL probe modes: a release whose CRD lacks them does not
// know the modes.
const (
	grpcField  = "v1alpha1:spec.healthcheck.probes[].grpc"
	mysqlField = "v1alpha1:spec.healthcheck.probes[].mySQL"
)

// The MySQL probe's account (docs/EXAMPLES.md's) and its credential Secret.
const (
	mysqlUser, mysqlPassword = "swh_probe", "change-me"
	mysqlSecret              = "mysql-probe-credentials"
)

// TestRollbackToAReleaseWithoutTheGRPCAndMySQLModesAndThePlatformOperatorsWay starts HEAD (its
// CRD, chart RBAC and policies, programs as their ServiceAccounts) with a resource whose pods
// serve HTTP on 8080 (port web, HTTP probe), gRPC health on 9090 (port grpc, GRPC probe) and a
// real MariaDB on 3306 (port db, MySQL probe with a credential Secret the chart's RBAC lets the
// agents read), and request loops through the ClusterIP of web (HTTP) and db (MySQL logins).
// Then, with the oldest release that lacks both modes (docs/UPGRADE.md, "From v0.2.0 back to
// v0.1.0"):
//
//  1. a rollback with the GRPC and MySQL probes in place: the older agent publishes every port
//     of every pod not ready — web too, whose own HTTP probe passes — and the loops fail (what
//     the document warns of, observed);
//  2. upgraded again and the probes written back, the documented way: the GRPC and MySQL probes
//     replaced by TCP probes on the same ports while HEAD runs, then the rollback: zero failed
//     requests in both loops from the start of the rollback until one agentLostGrace after it,
//     and every pod ready on every port after it.
func TestRollbackToAReleaseWithoutTheGRPCAndMySQLModesAndThePlatformOperatorsWay(t *testing.T) {
	cluster.SkipUnlessIsolated(t)
	all := sources(t)
	prev := all[len(all)-1]
	old, head := versions(t, prev)
	added := addedSpecFields(t, old.CRD, head.CRD)
	if !slices.Contains(added, grpcField) || !slices.Contains(added, mysqlField) {
		t.Skipf("the oldest release v%s knows the GRPC or the MySQL probe mode (HEAD adds %v): no release to roll back to lacks both", prev.Version, added)
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
	// What the chart's credential hook renders for the resource's Secret: a Role that lets the
	// agents read it (left in place by the replacements below, which apply the charts without it).
	credValues, err := chartValues(bundle.CredentialSecrets(bundle.NamespaceNames{Namespace: ns, Names: []string{mysqlSecret}}))
	require.NoError(t, err)
	root, err := bundle.Root()
	require.NoError(t, err)
	headCreds, err := chartAccess(root, credValues)
	require.NoError(t, err)
	applyAccess(t, c, headCreds, nil)
	require.NoError(t, c.Env.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: mysqlSecret},
		Type:       corev1.SecretType(wellknown.SecretTypeMySQLCredentials),
		StringData: map[string]string{"user": mysqlUser, "password": mysqlPassword, "tlsMode": "Disabled"},
	}))
	var pods []*cluster.Pod
	for i, n := range c.Nodes {
		p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "app-" + n.Name, Node: n.Name, Labels: map[string]string{"app": "app"},
			ContainerPorts: []corev1.ContainerPort{{Name: "web", ContainerPort: 8080}, {Name: "grpc", ContainerPort: 9090}, {Name: "db", ContainerPort: 3306}}})
		p.ServeHTTP(t, 8080)
		serveGRPCHealth(t, p)
		db := mariadb.StartForTest(t, p.MariaDBOptions(mariadb.Options{ServerID: i + 1}))
		require.NoError(t, db.CreateUser(ctx, mysqlUser, mysqlPassword))
		pods = append(pods, p)
	}
	httpProbe := tm.HTTPProbe(intstr.FromInt32(8080))
	grpcProbe := v1alpha1.Probe{Mode: v1alpha1.ProbeModeGRPC, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: tm.FailureThreshold,
		GRPC: &v1alpha1.GRPCProbe{TargetPort: intstr.FromInt32(9090)}}
	mysqlProbe := v1alpha1.Probe{Mode: v1alpha1.ProbeModeMySQL, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: tm.FailureThreshold,
		MySQL: &v1alpha1.MySQLProbe{TargetPort: intstr.FromInt32(3306), Query: "SELECT 1", AuthSecretName: mysqlSecret}}
	ports := []v1alpha1.ServicePort{e2e.ServicePort("web", 80, intstr.FromInt32(8080)), e2e.ServicePort("grpc", 9090, intstr.FromInt32(9090)),
		e2e.ServicePort("db", 3306, intstr.FromInt32(3306))}
	res := tm.Resource(ns, "app", map[string]string{"app": "app"}, ports, httpProbe, grpcProbe, mysqlProbe)
	require.NoError(t, c.Env.Client.Create(ctx, res))
	requireAllEndpoints(t, tm, c, ns, pods, len(ports), "TTF")
	c.WaitProgrammed(t, ns+"/app", 80, pods...)
	c.WaitProgrammed(t, ns+"/app", 3306, pods...)

	login := &cluster.MySQLLogin{User: mysqlUser, Password: mysqlPassword}
	loops := map[string]*cluster.Traffic{
		"web": c.Traffic(t, cluster.TrafficOptions{Service: ns + "/app", Port: 80, Protocol: cluster.HTTP, Duration: loopFor}),
		"db":  c.Traffic(t, cluster.TrafficOptions{Service: ns + "/app", Port: 3306, Protocol: cluster.MySQL, MySQL: login, Duration: loopFor}),
	}
	waitAfter(t, loops, time.Now())

	// 1. The rollback the document warns of. The older agent runs only the HTTP probe (one
	// target per node): the GRPC and MySQL probes are not runnable there.
	bad := replace(t, s, "rollback to v"+prev.Version+" with GRPC and MySQL probes", old, head, 1)
	requireAllEndpoints(t, tm, c, ns, pods, len(ports), "FFF")
	waitAfter(t, loops, time.Now())
	for name, l := range loops {
		failed := l.Results().Since(bad.From).Failed()
		assert.NotEmpty(t, failed, "%s: v%s takes the pods of a resource with GRPC and MySQL probes out of traffic", name, prev.Version)
		t.Logf("%s: %d failed requests since the %s at %s", name, len(failed), bad.Name, bad.From.Format("15:04:05.000"))
	}

	// 2. Back to HEAD, the probes written again (the older controller's status writes dropped
	// their sections), then the documented way.
	replace(t, s, "upgrade to HEAD again", head, old, 1)
	setProbes(t, c, ns, "app", httpProbe, grpcProbe, mysqlProbe)
	requireAllEndpoints(t, tm, c, ns, pods, len(ports), "TTF")
	c.WaitProgrammed(t, ns+"/app", 80, pods...)
	c.WaitProgrammed(t, ns+"/app", 3306, pods...)
	waitAfter(t, loops, time.Now())
	setProbes(t, c, ns, "app", httpProbe, tm.TCPProbe(intstr.FromInt32(9090)), tm.TCPProbe(intstr.FromInt32(3306)))
	requireAllEndpoints(t, tm, c, ns, pods, len(ports), "TTF")
	good := replace(t, s, "rollback to v"+prev.Version+" after replacing the GRPC and MySQL probes by TCP", old, head, len(ports))
	waitAfter(t, loops, good.To.Add(agentLostGrace))
	requireAllEndpoints(t, tm, c, ns, pods, len(ports), "TTF")
	for name, l := range loops {
		in := tm.RequireWindow(t, l.Stop(), name+" "+good.Name, good.From, good.To.Add(agentLostGrace))
		assert.Empty(t, in.Failed(), "%s: failed requests during the %s: %s", name, good.Name, e2e.Failures(in))
		assert.Len(t, in.ByPod(), len(pods), "%s: every pod answered during the %s: %v", name, good.Name, in.ByPod())
		t.Logf("%s during the %s: %s", name, good.Name, in)
	}
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

// requireAllEndpoints waits until every pod is listed on each of the ports of the resource "app"
// with the conditions want ("RST", e2e.Conds) and nothing else is listed.
func requireAllEndpoints(t *testing.T, tm e2e.Timing, c *cluster.Cluster, ns string, pods []*cluster.Pod, ports int, want string) {
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
			assert.Equal(ct, ports, seen[p.IP.String()], "%s is listed on every port", p.Key())
		}
	}, tm.WaitFor, tm.Poll, "every pod %s on every port", want)
}
