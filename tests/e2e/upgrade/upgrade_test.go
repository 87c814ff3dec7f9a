// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package upgrade_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

const (
	// crdFile is the module's CRD in crds/ (of every release).
	crdFile = "servicewithhealthchecks.yaml"
	// exampleFile is the documented manifest the test runs: the VM with web and SMTP
	// (docs/EXAMPLES.md), two resources with an HTTP and a TCP probe.
	exampleFile = "docs/examples/vm.yaml"
	// agentLostGrace is the module setting the charts are rendered with (the documented
	// example of a short grace); every window lasts at least this long after its event settled,
	// the time after which a missed renewal would have withdrawn a node.
	agentLostGrace = 8 * time.Second
	// minInWindow is the fewest requests each loop must send inside every window.
	minInWindow = 50
	// loopFor bounds the request loops; the test stops them long before.
	loopFor = 20 * time.Minute
	// unknownField is a field no release's schema has: what any field of a later release is to
	// an earlier API server.
	unknownField = "fieldOfALaterRelease"
	// podsPerNode are the pods the example selects on each node.
	podsPerNode = 2
	// maxEndpointsPerSlice is HEAD's agent flag --max-endpoints-per-slice in the test (the
	// previous release's agent has no such flag and publishes one slice per port and node):
	// podsPerNode endpoints of a port on a node are that many slices under HEAD, the common
	// name and chunks.
	maxEndpointsPerSlice = 1
)

// kit holds the shared e2e helpers with the example's timing (failureThreshold 2).
var kit = e2e.Timing{PeriodSeconds: 5, FailureThreshold: 2, MinInWindow: minInWindow, WaitFor: 2 * time.Minute, Poll: 100 * time.Millisecond}

// protocols are what the pods serve on the example's target ports.
var protocols = map[int32]cluster.Protocol{8080: cluster.HTTP, 2525: cluster.SMTP}

// servicePort is one port of one resource of the example.
type servicePort struct {
	Resource, Name string
	Port, Target   int32
}

// key is the port as the slice monitor names it: "<resource>/<port name>".
func (p servicePort) key() string { return p.Resource + "/" + p.Name }

// programs are one version's binaries and chart flags.
type programs struct {
	Name                      string
	CRD                       string
	Bins                      stack.Binaries
	ControllerArgs, AgentArgs []string
	ExampleDir                string
	// Access are the chart's RBAC and admission policies (accessKinds).
	Access bundle.Objects
}

// window is the span of one replacement: from its first step until it settled.
type window struct {
	Name     string
	From, To time.Time
}

// TestReleaseUpgradeAndRollbackUnderTrafficFromThePreviousRelease runs upgradeAndRollback from
// the newest release recorded in CHANGELOG.md whose product differs from HEAD's (the first of
// upgradeSources), so that the upgrade crosses a code change.
func TestReleaseUpgradeAndRollbackUnderTrafficFromThePreviousRelease(t *testing.T) {
	cluster.SkipUnlessIsolated(t)
	upgradeAndRollback(t, sources(t)[0])
}

// TestReleaseUpgradeAndRollbackUnderTrafficFromTheOldestRelease runs upgradeAndRollback from the
// oldest release recorded (the oldest supported), so that the fields of every release between
// are checked as ignored by the oldest programs. When the oldest is the previous release, the
// test above runs it and this one says so and skips. The two are separate tests so that the
// package's two processes (TestMain, testkit/shard) run one each.
func TestReleaseUpgradeAndRollbackUnderTrafficFromTheOldestRelease(t *testing.T) {
	cluster.SkipUnlessIsolated(t)
	all := sources(t)
	if len(all) == 1 {
		t.Skipf("the oldest release v%s is the previous release: TestReleaseUpgradeAndRollbackUnderTrafficFromThePreviousRelease upgrades from it", all[0].Version)
	}
	upgradeAndRollback(t, all[len(all)-1])
}

// upgradeAndRollback runs release prev (its CRD, its programs, its chart's flags, RBAC and
// admission policies, its docs/examples/vm.yaml; every program as its ServiceAccount with a
// token bound to a pod on its node) with
// podsPerNode pods per node, upgrades it to HEAD as the platform does (CRD, the chart's RBAC and
// policies, controller rollout,
// agents node by node; HEAD's agents with --max-endpoints-per-slice=maxEndpointsPerSlice, so
// they split each port's endpoints on a node into chunks) and rolls it back the same way (the
// previous agent merges the chunks back into its one slice per port and node), with request
// loops through every Service port's ClusterIP. Asserted: zero failed requests in every window
// (each with at least minInWindow requests, answered by every pod); every port lists every pod
// ready in every state of the slices; an endpoint leaves a slice only when another slice of its
// port, node and family already lists it (into a chunk after the upgrade, out of it after the
// rollback: both seen for every port and node); a slice goes only once its successor exists;
// HEAD publishes the chunks under their names and the rollback leaves the names of the previous
// release; every resource keeps its clusterIP,
// its ready counts and its True conditions in every version seen; each step ran the programs
// it should (the processes' executables); the fields HEAD's CRD adds are pruned under the old
// CRD and a write carrying one is refused with strict field validation.
func upgradeAndRollback(t *testing.T, prev builtRelease) {
	old, head := versions(t, prev)
	added := addedSpecFields(t, old.CRD, head.CRD)
	t.Logf("previous release v%s (commit %s, built in %s); fields HEAD's CRD adds: %v", prev.Version, prev.FullCommit[:12], prev.Dir, added)

	c := cluster.Start(t, cluster.Options{
		Nodes:        []cluster.Node{{Name: "node-a", Zone: "zone-a"}, {Name: "node-b", Zone: "zone-b"}},
		KubeProxy:    true,
		ControlPlane: controlplane.Options{SkipModuleCRDs: true, ExtraCRDPaths: []string{old.CRD}},
	})
	// The previous release's chart: its RBAC and policies in force before its programs start,
	// each program as its ServiceAccount.
	applyAccess(t, c, old.Access, nil)
	waitPoliciesInForce(t, c, old.Access)
	kubeconfigs := programKubeconfigs(t, c, stack.DefaultControllers)
	requireNoAdministrator(t, kubeconfigs)
	s := stack.Start(t, stack.Options{Cluster: c, Binaries: &old.Bins, ControllerArgs: old.ControllerArgs, AgentArgs: old.AgentArgs,
		Kubeconfigs: func(program string) string { return kubeconfigs[program] }})
	requirePrograms(t, s, old)
	ctx := t.Context()
	ns := c.Env.CreateNamespaceForTest(t, "upgrade")
	ports := examplePorts(t, filepath.Join(old.ExampleDir, exampleFile))
	pods := startPods(t, c, ns)
	sliceMon := watchSlices(t, c, ns)
	statusMon := watchStatuses(t, c, ns)
	require.NoError(t, s.ApplyFile(ctx, ns, filepath.Join(old.ExampleDir, exampleFile)))
	holdPublished(t, c, ns, ports, pods, sliceMon, statusMon)
	before := sliceMon.Names()

	loops := map[string]*cluster.Traffic{}
	for _, p := range ports {
		loops[p.key()] = c.Traffic(t, cluster.TrafficOptions{Service: ns + "/" + p.Resource, Port: p.Port, Protocol: protocols[p.Target], Duration: loopFor})
	}
	waitAfter(t, loops, time.Now())

	targets := len(resourcesOf(ports)) * podsPerNode // one probe per resource and pod
	up := replace(t, s, "upgrade to HEAD", head, old, targets)
	waitAfter(t, loops, up.To.Add(agentLostGrace))
	afterUpgrade := requireSliceLayout(t, sliceMon, ports, c.Nodes, maxEndpointsPerSlice)
	// The operator's manifests follow the docs: HEAD's example (any field it uses that the
	// previous release lacks is now stored).
	require.NoError(t, s.ApplyFile(ctx, ns, filepath.Join(head.ExampleDir, exampleFile)))
	storedNew := newFieldsStored(t, c, ns, filepath.Join(head.ExampleDir, exampleFile), ports, added)

	down := replace(t, s, "rollback to v"+prev.Version, old, head, targets)
	waitAfter(t, loops, down.To.Add(agentLostGrace))
	afterRollback := requireSliceLayout(t, sliceMon, ports, c.Nodes, 0)
	assert.Equal(t, before, afterRollback, "the rollback leaves the previous release's slice names")
	requireNewFieldsIgnored(t, c, ns, ports, storedNew)
	requireUnknownFieldRefused(t, c, ns, ports[0].Resource)

	results := map[string]cluster.Results{}
	for k, l := range loops {
		results[k] = l.Stop()
	}
	for _, p := range ports {
		res := results[p.key()]
		assert.Empty(t, res.Failed(), "%s: failed requests: %s", p.key(), e2e.Failures(res))
		for _, w := range []window{up, down} {
			in := kit.RequireWindow(t, res, p.key()+" "+w.Name, w.From, w.To.Add(agentLostGrace))
			assert.Len(t, in.ByPod(), len(pods), "%s: every pod answered during the %s: %v", p.key(), w.Name, in.ByPod())
		}
		t.Logf("%s: %s", p.key(), res)
	}
	violations, renames, changes := sliceMon.Report()
	assert.Empty(t, violations, "the slices during the upgrade and the rollback")
	moves := sliceMon.Moves()
	requireMoves(t, moves, ports, c.Nodes, up, down)
	statusViolations, seen := statusMon.Report()
	assert.Empty(t, statusViolations, "the resources' status during the upgrade and the rollback")
	t.Logf("slices before: %v, after the upgrade: %v, after the rollback: %v; deleted -> successor: %v; %d resource versions seen; %d relists of the slices; endpoint moves:\n  %s\nslice changes:\n  %s",
		before, afterUpgrade, afterRollback, renames, seen, sliceMon.Relists(), joinMoves(moves), strings.Join(changes, "\n  "))
	t.Logf("FIGURES scenario=release-upgrade from=v%s upgrade=%s rollback=%s", prev.Version,
		up.To.Sub(up.From).Round(time.Millisecond), down.To.Sub(down.From).Round(time.Millisecond))
	for _, p := range ports {
		if u := statusMon.Current(p.Resource); u != nil {
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			t.Logf("%s after the rollback: conditions %v", p.Resource, conditionTypes(conds))
		}
	}
	requireMonitorsSeeAWithdrawal(t, sliceMon, statusMon, pods[len(pods)-1])
}

// versions are the previous release's and HEAD's programs, CRDs and chart flags.
func versions(t *testing.T, prev builtRelease) (old, head programs) {
	t.Helper()
	root, err := bundle.Root()
	require.NoError(t, err)
	values, err := chartValues(nil)
	require.NoError(t, err)
	old = programs{Name: "v" + prev.Version, CRD: filepath.Join(prev.Src(), "crds", crdFile), Bins: prev.Binaries(), ExampleDir: prev.Src()}
	old.ControllerArgs, old.AgentArgs, err = chartArgs(prev.Src(), values)
	require.NoError(t, err, "the previous release's chart")
	old.Access, err = chartAccess(prev.Src(), values)
	require.NoError(t, err, "the previous release's chart")
	headBins, err := stack.Build()
	require.NoError(t, err)
	head = programs{Name: "HEAD", CRD: filepath.Join(root, "crds", crdFile), Bins: headBins, ExampleDir: root}
	head.ControllerArgs, head.AgentArgs, err = chartArgs("", values)
	require.NoError(t, err, "HEAD's chart")
	head.Access, err = chartAccess(root, values)
	require.NoError(t, err, "HEAD's chart")
	// The chart does not render the flag (the default, 100, is the built-in controller's); a
	// small one makes HEAD publish chunks with a few pods. Only HEAD's agent knows it.
	head.AgentArgs = append(head.AgentArgs, "--max-endpoints-per-slice="+strconv.Itoa(maxEndpointsPerSlice))
	t.Logf("v%s flags: controller %v, agent %v; HEAD's: controller %v, agent %v; policies: v%s %v, HEAD %v", prev.Version,
		old.ControllerArgs, old.AgentArgs, head.ControllerArgs, head.AgentArgs, prev.Version, accessNames(old.Access), accessNames(head.Access))
	return old, head
}

// chartValues are the values both charts are rendered with: the default settings with
// agentLostGrace, and what the hooks would write (the renewal interval, a quarter of the grace;
// credentials: internal.credentialSecrets, bundle.CredentialSecrets, nil for none).
func chartValues(credentials map[string]any) (map[string]any, error) {
	internal := map[string]any{"agent": map[string]any{"leaseRenewInterval": (agentLostGrace / 4).String()}}
	for k, v := range credentials {
		internal[k] = v
	}
	return bundle.ValueSet{
		Settings:       map[string]any{"agentLostGrace": agentLostGrace.String()},
		Internal:       internal,
		EnabledModules: bundle.AllPlatformModules,
	}.Values()
}

// addedSpecFields are the fields of HEAD's CRD the previous one lacks, in every version.
func addedSpecFields(t *testing.T, oldCRD, newCRD string) []string {
	t.Helper()
	o, err := crdSchemas(oldCRD)
	require.NoError(t, err)
	n, err := crdSchemas(newCRD)
	require.NoError(t, err)
	var out []string
	for v, schemaOf := range n {
		for _, f := range addedFields(o[v], schemaOf) {
			out = append(out, v+":"+f)
		}
	}
	return out
}

// examplePorts reads the resources and ports of the example file.
func examplePorts(t *testing.T, path string) []servicePort {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	objs, err := stack.DecodeYAML(data)
	require.NoError(t, err)
	var out []servicePort
	for _, o := range objs {
		specPorts, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
		for _, sp := range specPorts {
			m, _ := sp.(map[string]any)
			name, _ := m["name"].(string)
			port, _ := toInt64(m["port"])
			target, ok := toInt64(m["targetPort"])
			require.True(t, ok, "%s: %s's ports name their target by number", path, o.GetName())
			_, served := protocols[int32(target)]
			require.True(t, served, "%s: no server for target port %d", path, target)
			out = append(out, servicePort{Resource: o.GetName(), Name: name, Port: int32(port), Target: int32(target)})
		}
	}
	require.NotEmpty(t, out, "%s has resources with ports", path)
	return out
}

// startPods starts podsPerNode pods per node selected by the example (vm: mail-1) serving
// every target port.
func startPods(t *testing.T, c *cluster.Cluster, ns string) []*cluster.Pod {
	t.Helper()
	var pods []*cluster.Pod
	for i := range podsPerNode * len(c.Nodes) {
		n := c.Nodes[i%len(c.Nodes)]
		var cps []corev1.ContainerPort
		for target := range protocols {
			cps = append(cps, corev1.ContainerPort{ContainerPort: target, Protocol: corev1.ProtocolTCP})
		}
		p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: fmt.Sprintf("mail-1-%s-%d", n.Name, i/len(c.Nodes)), Node: n.Name,
			Labels: map[string]string{"vm": "mail-1"}, ContainerPorts: cps})
		for target, proto := range protocols {
			switch proto {
			case cluster.SMTP:
				p.ServeSMTP(t, int(target))
			default:
				p.ServeHTTP(t, int(target))
			}
		}
		pods = append(pods, p)
	}
	return pods
}

// holdPublished waits until every port lists every pod ready, kube-proxy routes each to all
// of them and every resource's status says so; then the monitors hold that state.
func holdPublished(t *testing.T, c *cluster.Cluster, ns string, ports []servicePort, pods []*cluster.Pod, sliceMon *sliceMonitor, statusMon *statusMonitor) {
	t.Helper()
	var keys []string
	for _, p := range ports {
		keys = append(keys, p.key())
	}
	names := resourcesOf(ports)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		sliceMon.mu.Lock()
		defer sliceMon.mu.Unlock()
		for _, k := range keys {
			assert.Len(ct, sliceMon.readyOf(k), len(pods), "ready endpoints of %s", k)
		}
	}, kit.WaitFor, kit.Poll)
	for _, p := range ports {
		c.WaitProgrammed(t, ns+"/"+p.Resource, p.Port, pods...)
	}
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		held, err := statusMon.Hold(names)
		require.NoError(ct, err)
		for _, n := range names {
			for port, ready := range held[n].Ready {
				assert.EqualValues(ct, len(pods), ready, "%s port %q", n, port)
			}
		}
	}, kit.WaitFor, kit.Poll)
	_, err := sliceMon.Hold(keys)
	require.NoError(t, err)
}

// resourcesOf are the resources of ports, in order.
func resourcesOf(ports []servicePort) []string {
	var out []string
	for _, p := range ports {
		if !slices.Contains(out, p.Resource) {
			out = append(out, p.Resource)
		}
	}
	return out
}

// waitAfter waits until every loop has sent minInWindow requests after t.
func waitAfter(t *testing.T, loops map[string]*cluster.Traffic, after time.Time) {
	t.Helper()
	for _, l := range loops {
		kit.WaitRequestsAfter(t, l, after, minInWindow)
	}
}

// replace moves the stack from the programs from to the programs to, the way the platform
// applies a module release: the CRD first, then the chart's RBAC and admission policies (the
// Helm release's objects; from's that to lacks deleted), then the controller Deployment's rollout (maxSurge 0, maxUnavailable 1: one
// replica stopped, its replacement started and ready, then the next; leadership moves to a
// replica of the new version when the old leader stops and releases its Lease), then the agent
// DaemonSet node by node (maxUnavailable 1: each new agent ready, its Lease renewed and every
// target probed failureThreshold+2 times before the next node's agent stops).
func replace(t *testing.T, s *stack.Stack, name string, to, from programs, targetsPerNode int) window {
	t.Helper()
	ctx := t.Context()
	w := window{Name: name, From: time.Now()}
	require.NoError(t, s.ApplyFile(ctx, "", to.CRD), "%s: applying the CRD", name)
	requireEstablished(t, s)
	applyAccess(t, s.Cluster, to.Access, from.Access)
	s.UsePrograms(to.Bins, to.ControllerArgs, to.AgentArgs)
	holder, err := e2e.ElectionHolder(ctx, s)
	require.NoError(t, err)
	for i := s.Controllers() - 1; i >= 0; i-- {
		pid := s.ControllerPID(i)
		require.NoError(t, s.StopController(ctx, i), "%s: stopping controller %d", name, i)
		require.NoError(t, s.StartController(ctx, i), "%s: starting controller %d", name, i)
		require.NotEqual(t, pid, s.ControllerPID(i), "%s: controller %d is a new process", name, i)
	}
	leader, err := s.WaitLeader(ctx)
	require.NoError(t, err)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		now, err := e2e.ElectionHolder(ctx, s)
		require.NoError(ct, err)
		assert.NotEqual(ct, holder, now, "the election Lease names a replica of %s", to.Name)
		n, err := e2e.ScrapeSum(ctx, s.ControllerMetricsAddr(leader), "swh_controller_reconciles_total")
		require.NoError(ct, err)
		assert.Positive(ct, n, "the new leader reconciles")
	}, kit.WaitFor, kit.Poll)
	for _, n := range s.Nodes() {
		kit.RestartAgent(t, s, n, targetsPerNode)
	}
	w.To = time.Now()
	requirePrograms(t, s, to)
	t.Logf("%s: CRD, %d controllers, %d agents replaced from %s to %s (%s)", name, s.Controllers(), len(s.Nodes()),
		w.From.Format("15:04:05.000"), w.To.Format("15:04:05.000"), w.To.Sub(w.From).Round(time.Millisecond))
	return w
}

// requireEstablished waits until the module's CRD is Established (it stays so across an
// update; the API server serves the new schema from then on).
func requireEstablished(t *testing.T, s *stack.Stack) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		crd := &unstructured.Unstructured{}
		crd.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
		require.NoError(ct, s.Client().Get(t.Context(), client.ObjectKey{Name: "servicewithhealthchecks.network.deckhouse.io"}, crd))
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		established := false
		for _, c := range conds {
			m, _ := c.(map[string]any)
			established = established || (m["type"] == "Established" && m["status"] == "True")
		}
		assert.True(ct, established)
	}, kit.WaitFor, kit.Poll)
}

// requirePrograms asserts that every controller replica and agent runs the programs of p.
func requirePrograms(t *testing.T, s *stack.Stack, p programs) {
	t.Helper()
	for i := range s.Controllers() {
		assert.Equal(t, p.Bins.Controller, exe(t, s.ControllerPID(i)), "controller %d runs %s's program", i, p.Name)
	}
	for _, n := range s.Nodes() {
		assert.Equal(t, p.Bins.Agent, exe(t, s.AgentPID(n)), "the agent of %s runs %s's program", n, p.Name)
	}
}

// exe is the executable a process runs.
func exe(t *testing.T, pid int) string {
	t.Helper()
	require.Positive(t, pid)
	path, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	require.NoError(t, err)
	return path
}

// newFieldsStored reads every resource from the API server after HEAD's example was applied
// (a read after the write: it sees it) and returns which added fields (version:path) each
// stores. Every added field HEAD's example sets must be stored: otherwise the rollback would
// check nothing of what the later releases added.
func newFieldsStored(t *testing.T, c *cluster.Cluster, ns, example string, ports []servicePort, added []string) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(example)
	require.NoError(t, err)
	objs, err := stack.DecodeYAML(data)
	require.NoError(t, err)
	inExample := map[string][]string{}
	for _, o := range objs {
		for _, f := range added {
			if _, path, _ := strings.Cut(f, ":"); hasPath(o.Object, splitPath(path)) {
				inExample[o.GetName()] = append(inExample[o.GetName()], path)
			}
		}
	}
	out := map[string][]string{}
	for _, name := range resourcesOf(ports) {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(resourceListGVK.GroupVersion().WithKind("ServiceWithHealthchecks"))
		require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, u))
		for _, f := range added {
			if _, path, _ := strings.Cut(f, ":"); hasPath(u.Object, splitPath(path)) {
				out[name] = append(out[name], path)
			}
		}
		assert.Subset(t, out[name], inExample[name], "%s stores the added fields HEAD's example sets", name)
	}
	t.Logf("fields of HEAD's CRD stored before the rollback: %v (HEAD's example sets %v)", out, inExample)
	return out
}

// splitPath splits a field path at its dots.
func splitPath(path string) []string { return strings.Split(path, ".") }

// hasPath tells whether obj sets the field at path ("probes[]" walks every list item).
func hasPath(obj any, path []string) bool {
	if len(path) == 0 {
		return true
	}
	m, ok := obj.(map[string]any)
	if !ok {
		return false
	}
	name, list := strings.CutSuffix(path[0], "[]")
	v, ok := m[name]
	if !ok {
		return false
	}
	if !list {
		return hasPath(v, path[1:])
	}
	items, _ := v.([]any)
	for _, it := range items {
		if hasPath(it, path[1:]) {
			return true
		}
	}
	return false
}

// requireNewFieldsIgnored asserts that under the old CRD the API server no longer returns the
// fields only HEAD's CRD has: they are pruned when a stored object is read, so the old
// programs never see them (they stay in etcd until the object is written again).
func requireNewFieldsIgnored(t *testing.T, c *cluster.Cluster, ns string, ports []servicePort, stored map[string][]string) {
	t.Helper()
	for _, p := range ports {
		paths := stored[p.Resource]
		if len(paths) == 0 {
			continue
		}
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(resourceListGVK.GroupVersion().WithKind("ServiceWithHealthchecks"))
			require.NoError(ct, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: p.Resource}, u))
			for _, path := range paths {
				assert.False(ct, hasPath(u.Object, splitPath(path)), "%s: %s is pruned under the old CRD", p.Resource, path)
			}
		}, kit.WaitFor, kit.Poll)
	}
}

// requireUnknownFieldRefused asserts what a write carrying a field the served CRD does not know
// gets (any field of a later release, under an earlier release's CRD): refused with strict
// field validation (kubectl apply --validate=strict, the default of kubectl), and with
// validation off accepted with the field dropped. Both are dry runs.
func requireUnknownFieldRefused(t *testing.T, c *cluster.Cluster, ns, resource string) {
	t.Helper()
	ctx := t.Context()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(resourceListGVK.GroupVersion().WithKind("ServiceWithHealthchecks"))
	require.NoError(t, c.Env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: resource}, u))
	require.NoError(t, unstructured.SetNestedField(u.Object, "on", "spec", unknownField))
	strict := u.DeepCopy()
	err := c.Env.Client.Update(ctx, strict, client.DryRunAll, client.FieldValidation("Strict"))
	require.Error(t, err, "a write with an unknown field is refused with strict validation")
	assert.Contains(t, err.Error(), `unknown field "spec.`+unknownField+`"`)
	lax := u.DeepCopy()
	require.NoError(t, c.Env.Client.Update(ctx, lax, client.DryRunAll, client.FieldValidation("Ignore")))
	_, found, _ := unstructured.NestedFieldNoCopy(lax.Object, "spec", unknownField)
	assert.False(t, found, "without strict validation the unknown field is dropped")
}

// requireMonitorsSeeAWithdrawal proves the monitors would have seen a lost endpoint (their
// reports were asserted empty before): one pod is removed, and both report it.
func requireMonitorsSeeAWithdrawal(t *testing.T, sliceMon *sliceMonitor, statusMon *statusMonitor, pod *cluster.Pod) {
	t.Helper()
	require.NoError(t, pod.Remove(context.Background()))
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		v, _, _ := sliceMon.Report()
		assert.NotEmpty(ct, v, "the slice monitor sees %s withdrawn", pod.Key())
		sv, _ := statusMon.Report()
		assert.NotEmpty(ct, sv, "the status monitor sees fewer ready endpoints")
	}, kit.WaitFor, kit.Poll)
}

// conditionTypes lists "Type=Status" of conditions.
func conditionTypes(conds []any) []string {
	var out []string
	for _, c := range conds {
		m, _ := c.(map[string]any)
		out = append(out, fmt.Sprintf("%v=%v", m["type"], m["status"]))
	}
	return out
}

// requireSliceLayout waits until every port has, on every node, the slices its podsPerNode
// endpoints fill with perSlice endpoints a slice (0: all in one, the previous release's one
// slice per port and node): the common name <resource>-<port>-<node> and the chunks
// <resource>-<port>---<k>-<node> (slicemeta.SliceKey.Chunk), each listing its share of the
// node's endpoints, all ready. It returns the slices' names, sorted.
func requireSliceLayout(t *testing.T, sliceMon *sliceMonitor, ports []servicePort, nodes []cluster.NodeInfo, perSlice int) []string {
	t.Helper()
	if perSlice == 0 {
		perSlice = podsPerNode
	}
	chunks := (podsPerNode + perSlice - 1) / perSlice
	want := map[string]int{} // name -> endpoints
	for _, p := range ports {
		for _, n := range nodes {
			for k := range chunks {
				want[slicemeta.SliceKey{Resource: p.Resource, Port: p.Name, Node: n.Name, Chunk: k}.Name()] = min(perSlice, podsPerNode-k*perSlice)
			}
		}
	}
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		got := sliceMon.Endpoints()
		assert.ElementsMatch(ct, slices.Collect(maps.Keys(want)), slices.Collect(maps.Keys(got)), "the slices' names")
		for name, eps := range got {
			assert.Len(ct, eps, want[name], "endpoints of %s: %v", name, eps)
			for a, conds := range eps {
				assert.True(ct, strings.HasPrefix(conds, "T"), "%s lists %s ready: %s", name, a, conds)
			}
		}
	}, kit.WaitFor, kit.Poll)
	return sliceMon.Names()
}

// requireMoves asserts that the upgrade moved an endpoint of every port on every node from
// the common-name slice into a chunk and the rollback moved one back out of a chunk (the
// monitor judged each move safe: the receiving slice already listed it).
func requireMoves(t *testing.T, moves []endpointMove, ports []servicePort, nodes []cluster.NodeInfo, up, down window) {
	t.Helper()
	for _, p := range ports {
		for _, n := range nodes {
			into := slices.ContainsFunc(moves, func(mv endpointMove) bool {
				return mv.Port == p.key() && mv.Node == n.Name && mv.intoChunk() && !mv.At.Before(up.From) && mv.At.Before(down.From)
			})
			assert.True(t, into, "%s on %s: the upgrade moved an endpoint from the common slice into a chunk", p.key(), n.Name)
			out := slices.ContainsFunc(moves, func(mv endpointMove) bool {
				return mv.Port == p.key() && mv.Node == n.Name && mv.outOfChunk() && !mv.At.Before(down.From)
			})
			assert.True(t, out, "%s on %s: the rollback moved an endpoint from a chunk into the common slice", p.key(), n.Name)
		}
	}
}

// joinMoves is the moves, one a line.
func joinMoves(moves []endpointMove) string {
	out := make([]string, 0, len(moves))
	for _, mv := range moves {
		out = append(out, mv.String())
	}
	return strings.Join(out, "\n  ")
}
