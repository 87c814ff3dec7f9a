// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/scheduler"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/loopback"
)

var vmPorts = []corev1.ContainerPort{
	{Name: "web", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
	{Name: "smtp", ContainerPort: 2525, Protocol: corev1.ProtocolTCP},
	{Name: "health", ContainerPort: 9000, Protocol: corev1.ProtocolTCP},
}

// Scenarios 1 and 10: a "VM" with web (HTTP probe) and smtp (TCP probe). Stopping smtp on one
// VM withdraws it from the smtp slice only; traffic through kube-proxy to its smtp port stops
// reaching it while its web port keeps answering without a single failure.
func TestAFailingPortWithdrawsThePodFromThatPortOnly(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "vm")
	labels := map[string]string{"app": "vm"}
	vm0 := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "vm-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	vm1 := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "vm-1", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	vm0.ServeHTTP(t, 8080)
	vm1.ServeHTTP(t, 8080)
	smtp0 := vm0.ServeSMTP(t, 2525)
	vm1.ServeSMTP(t, 2525)
	createResource(t, c, ns, "vm", labels,
		[]v1alpha1.ServicePort{namedPort("web", 80, intstr.FromString("web")), namedPort("smtp", 25, intstr.FromInt32(2525))},
		httpProbe(intstr.FromInt32(8080), 2, 2), tcpProbe(intstr.FromString("smtp"), 2, 2))
	a := startAgent(t, c, "node-a")

	got := eventuallySlices(t, c, ns, "vm", map[string]map[string]string{
		"vm-web-node-a":  {ip(vm0): "TTF", ip(vm1): "TTF"},
		"vm-smtp-node-a": {ip(vm0): "TTF", ip(vm1): "TTF"},
	})
	assert.Equal(t, int32(8080), got["vm-web-node-a"].Port, "the web slice carries the resolved target port")
	assert.Equal(t, "web", got["vm-web-node-a"].PortName)
	assert.Equal(t, int32(2525), got["vm-smtp-node-a"].Port)
	assert.Equal(t, "smtp", got["vm-smtp-node-a"].PortName)
	assert.Equal(t, map[string]string{ip(vm0): "zone-a", ip(vm1): "zone-a"}, got["vm-web-node-a"].Zones)
	assert.Equal(t, map[string]string{ip(vm0): "node-a", ip(vm1): "node-a"}, got["vm-web-node-a"].Nodes)
	assert.Equal(t, map[string]string{ip(vm0): "vm-0", ip(vm1): "vm-1"}, got["vm-web-node-a"].Pods)
	webRV := got["vm-web-node-a"].RV
	c.WaitProgrammed(t, ns+"/vm", 25, vm0, vm1)
	c.WaitProgrammed(t, ns+"/vm", 80, vm0, vm1)

	web := c.Traffic(t, cluster.TrafficOptions{Service: ns + "/vm", Port: 80, Duration: 2 * time.Minute, Interval: 20 * time.Millisecond})
	smtp0.Stop()
	got = eventuallySlices(t, c, ns, "vm", map[string]map[string]string{
		"vm-web-node-a":  {ip(vm0): "TTF", ip(vm1): "TTF"},
		"vm-smtp-node-a": {ip(vm0): "FFF", ip(vm1): "TTF"},
	})
	assert.Equal(t, webRV, got["vm-web-node-a"].RV, "the web slice is not written while smtp fails")
	// The gauges count what the agent's writes have stored, set once a write has returned: the
	// slice's watch can show it first, so they are polled.
	assert.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.Equal(ct, 3.0, testutil.ToFloat64(a.Metrics.Endpoints.WithLabelValues(metrics.StateReady)))
		assert.Equal(ct, 1.0, testutil.ToFloat64(a.Metrics.Endpoints.WithLabelValues(metrics.StateNotReady)))
		assert.Equal(ct, 4.0, testutil.ToFloat64(a.Metrics.Targets))
	}, 30*time.Second, 50*time.Millisecond, "the endpoint gauges follow the smtp slice's write")
	eventuallyEvent(t, c, ns, agent.ReasonPortNotReady, "pod vm-0, port smtp: probe 1 (TCP): connection refused")
	c.WaitProgrammed(t, ns+"/vm", 25, vm1)
	smtpRes := c.Requests(t, cluster.TrafficOptions{Service: ns + "/vm", Port: 25, Protocol: cluster.SMTP, Count: 30})
	assert.Equal(t, map[string]int{vm1.Key(): 30}, smtpRes.ByPod(), "smtp requests reach only the VM whose smtp passes: %s", smtpRes)

	require.NoError(t, smtp0.Start())
	eventuallySlices(t, c, ns, "vm", map[string]map[string]string{
		"vm-web-node-a":  {ip(vm0): "TTF", ip(vm1): "TTF"},
		"vm-smtp-node-a": {ip(vm0): "TTF", ip(vm1): "TTF"},
	})
	webRes := web.Stop()
	assert.Empty(t, webRes.Failed(), "web traffic during the smtp outage: %s", webRes)
	assert.Greater(t, webRes.OK(), 10)
	assert.ElementsMatch(t, []string{vm0.Key(), vm1.Key()}, webRes.Pods(), "both VMs kept answering on web")
	got, err := slicesOf(t.Context(), c, ns, "vm")
	require.NoError(t, err)
	assert.Equal(t, webRV, got["vm-web-node-a"].RV, "the web slice was never written during the outage")
}

// Scenario 2: a probe on a dedicated health port checks the pod as a whole.
func TestAFailingHealthPortWithdrawsThePodFromEveryPort(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "health")
	labels := map[string]string{"app": "vm"}
	vm := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "vm-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	health := vm.ServeHTTP(t, 9000)
	createResource(t, c, ns, "vm", labels,
		[]v1alpha1.ServicePort{namedPort("web", 80, intstr.FromString("web")), namedPort("smtp", 25, intstr.FromInt32(2525))},
		httpProbe(intstr.FromString("health"), 1, 2))
	startAgent(t, c, "node-a")
	eventuallySlices(t, c, ns, "vm", map[string]map[string]string{
		"vm-web-node-a":  {ip(vm): "TTF"},
		"vm-smtp-node-a": {ip(vm): "TTF"},
	})
	health.SetHTTPStatus(503)
	eventuallySlices(t, c, ns, "vm", map[string]map[string]string{
		"vm-web-node-a":  {ip(vm): "FFF"},
		"vm-smtp-node-a": {ip(vm): "FFF"},
	})
	health.SetHTTPStatus(200)
	eventuallySlices(t, c, ns, "vm", map[string]map[string]string{
		"vm-web-node-a":  {ip(vm): "TTF"},
		"vm-smtp-node-a": {ip(vm): "TTF"},
	})
}

// Scenario 3: a port without a probe follows the pod's Ready condition; the probed one does not.
func TestAnUnprobedPortFollowsThePodsReadyCondition(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "ready")
	labels := map[string]string{"app": "vm"}
	vm := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "vm-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	vm.ServeHTTP(t, 8080)
	createResource(t, c, ns, "vm", labels,
		[]v1alpha1.ServicePort{namedPort("web", 80, intstr.FromString("web")), namedPort("smtp", 25, intstr.FromInt32(2525))},
		httpProbe(intstr.FromInt32(8080), 1, 2))
	startAgent(t, c, "node-a")
	eventuallySlices(t, c, ns, "vm", map[string]map[string]string{
		"vm-web-node-a":  {ip(vm): "TTF"},
		"vm-smtp-node-a": {ip(vm): "TTF"},
	})
	vm.SetReady(t, false)
	eventuallySlices(t, c, ns, "vm", map[string]map[string]string{
		"vm-web-node-a":  {ip(vm): "TTF"},
		"vm-smtp-node-a": {ip(vm): "FFF"},
	})
	vm.SetReady(t, true)
	eventuallySlices(t, c, ns, "vm", map[string]map[string]string{
		"vm-web-node-a":  {ip(vm): "TTF"},
		"vm-smtp-node-a": {ip(vm): "TTF"},
	})
}

// Scenario 4: a terminating pod that still passes drains: not ready, serving, terminating.
func TestATerminatingPodThatPassesIsServingAndTerminating(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "drain")
	labels := map[string]string{"app": "web"}
	p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	p.ServeHTTP(t, 8080)
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("", 80, intstr.FromInt32(8080))}, httpProbe(intstr.FromInt32(8080), 1, 2))
	startAgent(t, c, "node-a")
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-node-a": {ip(p): "TTF"}})
	p.MarkTerminating(t)
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-node-a": {ip(p): "FTT"}})
}

// Scenario 5: each agent publishes only its own node's pods, in its own node's slices.
func TestEachAgentPublishesOnlyItsOwnNode(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "nodes")
	labels := map[string]string{"app": "web"}
	a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-a", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-b", Node: "node-b", Labels: labels, ContainerPorts: vmPorts})
	a.ServeHTTP(t, 8080)
	b.ServeHTTP(t, 8080)
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))}, httpProbe(intstr.FromInt32(8080), 1, 2))
	startAgent(t, c, "node-a")
	// Only node-a's agent runs: node-b's pod is nobody's to publish yet.
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(a): "TTF"}})
	startAgent(t, c, "node-b")
	got := eventuallySlices(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-a": {ip(a): "TTF"},
		"web-http-node-b": {ip(b): "TTF"},
	})
	assert.Equal(t, map[string]string{ip(a): "node-a"}, got["web-http-node-a"].Nodes)
	assert.Equal(t, map[string]string{ip(b): "node-b"}, got["web-http-node-b"].Nodes)
	assert.Equal(t, map[string]string{ip(b): "zone-b"}, got["web-http-node-b"].Zones)
	c.WaitProgrammed(t, ns+"/web", 80, a, b)
}

// Scenario 6: a restarted agent adopts its slices: from before the stop until the new agent
// has run failureThreshold periods, neither endpoint flips (no write at all); then a real
// failure is still withdrawn.
func TestARestartedAgentAdoptsItsSlicesWithoutFlapping(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "restart")
	labels := map[string]string{"app": "web"}
	pass := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-pass", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	fail := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-fail", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	server := pass.ServeHTTP(t, 8080)
	const failureThreshold = 3
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))}, httpProbe(intstr.FromInt32(8080), 2, failureThreshold))
	first := startAgent(t, c, "node-a")
	want := map[string]map[string]string{"web-http-node-a": {ip(pass): "TTF", ip(fail): "FFF"}}
	eventuallySlices(t, c, ns, "web", want)

	w := watchSlices(t, c, ns)
	first.stop()
	second := startAgent(t, c, "node-a")
	// Both targets reach their decisive results (2 passes, failureThreshold failures), which
	// makes the new agent reconcile; two more periods give that reconcile ample time to write.
	runs := second.waitSettled(t)
	require.GreaterOrEqual(t, runs, float64(failureThreshold+2))
	assert.Empty(t, w.Events(), "no slice was written across the restart")
	eventuallySlices(t, c, ns, "web", want)

	server.Stop()
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(pass): "FFF", ip(fail): "FFF"}})
}

// Scenario 7: in steady state nothing is written while the probes keep running.
func TestSteadyStateWritesNothing(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "steady")
	labels := map[string]string{"app": "vm"}
	var pods []*cluster.Pod
	for _, name := range []string{"vm-0", "vm-1"} {
		p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: name, Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
		p.ServeHTTP(t, 8080)
		p.ServeSMTP(t, 2525)
		pods = append(pods, p)
	}
	createResource(t, c, ns, "vm", labels,
		[]v1alpha1.ServicePort{namedPort("web", 80, intstr.FromString("web")), namedPort("smtp", 25, intstr.FromInt32(2525))},
		httpProbe(intstr.FromInt32(8080), 1, 3), tcpProbe(intstr.FromInt32(2525), 1, 3))
	a := startAgent(t, c, "node-a")
	eventuallySlices(t, c, ns, "vm", map[string]map[string]string{
		"vm-web-node-a":  {ip(pods[0]): "TTF", ip(pods[1]): "TTF"},
		"vm-smtp-node-a": {ip(pods[0]): "TTF", ip(pods[1]): "TTF"},
	})
	w := watchSlices(t, c, ns)
	const periods, targets = 4, 4
	start := a.probeRuns()
	require.Eventually(t, func() bool { return a.probeRuns() >= start+periods*targets }, time.Minute, 50*time.Millisecond)
	assert.Empty(t, w.Events(), "steady state writes no slice")
}

// Scenario 8: a 240-character node name gives valid slice names (full when they fit, a digest
// when not) that stay the same across restarts.
func TestALongNodeNameGivesValidStableSliceNames(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "longnode")
	node := strings.Repeat("n", 60) + "." + strings.Repeat("o", 60) + "." + strings.Repeat("d", 60) + "." + strings.Repeat("e", 57)
	require.Len(t, node, 240)
	labels := map[string]string{"app": "web"}
	// The pod runs on a node the harness does not run (its hostname label would be too long):
	// the Node object exists without one (the agent publishes only once it has read its Node),
	// and the pod's object names the node and an address nothing dials (the resources have no
	// probes).
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	require.NoError(t, c.Env.Client.Create(t.Context(), n))
	t.Cleanup(func() { _ = c.Env.Client.Delete(context.Background(), n) })
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-0", Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "testkit.invalid/pod", Ports: vmPorts}}},
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), pod))
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "198.18.250.1", PodIPs: []corev1.PodIP{{IP: "198.18.250.1"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	require.NoError(t, c.Env.Client.Status().Update(t.Context(), pod))
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))})
	createResource(t, c, ns, "a-much-longer-resource-name", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))})

	a := startAgent(t, c, node)
	short := "web-http-" + node
	long := "a-much-longer-resource-name-http-" + wellknown.NodeDigest(node)
	got1 := eventuallySlices(t, c, ns, "web", map[string]map[string]string{short: {"198.18.250.1": "TTF"}})
	got2 := eventuallySlices(t, c, ns, "a-much-longer-resource-name", map[string]map[string]string{long: {"198.18.250.1": "TTF"}})
	for _, name := range []string{short, long} {
		assert.LessOrEqual(t, len(name), 253)
		assert.Empty(t, validation.IsDNS1123Subdomain(name))
	}
	assert.Equal(t, map[string]string{"198.18.250.1": node}, got2[long].Nodes, "endpoints carry the full node name")
	s := &discoveryv1.EndpointSlice{}
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: long}, s))
	assert.Equal(t, node, s.Annotations[wellknown.AnnotationNode])
	assert.NotContains(t, s.Labels, wellknown.LabelNode, "the node label is left out where the name does not fit")

	a.stop()
	startAgent(t, c, node)
	pod.Status.Conditions[0].Status = corev1.ConditionFalse
	require.NoError(t, c.Env.Client.Status().Update(t.Context(), pod))
	again1 := eventuallySlices(t, c, ns, "web", map[string]map[string]string{short: {"198.18.250.1": "FFF"}})
	again2 := eventuallySlices(t, c, ns, "a-much-longer-resource-name", map[string]map[string]string{long: {"198.18.250.1": "FFF"}})
	assert.NotEqual(t, got1[short].RV, again1[short].RV, "the restarted agent wrote the same slice")
	assert.NotEqual(t, got2[long].RV, again2[long].RV)
}

// Scenario 9: a named target port that resolves to different numbers on one node splits.
func TestANamedPortWithDifferentNumbersIsSplit(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "split")
	labels := map[string]string{"app": "web"}
	ports := func(n int32) []corev1.ContainerPort {
		return []corev1.ContainerPort{{Name: "web", ContainerPort: n, Protocol: corev1.ProtocolTCP}}
	}
	p1 := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-1", Node: "node-a", Labels: labels, ContainerPorts: ports(8080)})
	p2 := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-2", Node: "node-a", Labels: labels, ContainerPorts: ports(8080)})
	p3 := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-3", Node: "node-a", Labels: labels, ContainerPorts: ports(9090)})
	p1.ServeHTTP(t, 8080)
	p2.ServeHTTP(t, 8080)
	s3 := p3.ServeHTTP(t, 9090)
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromString("web"))}, httpProbe(intstr.FromString("web"), 1, 1))
	startAgent(t, c, "node-a")
	got := eventuallySlices(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-a":      {ip(p1): "TTF", ip(p2): "TTF"},
		"web-http-node-a-9090": {ip(p3): "TTF"},
	})
	assert.Equal(t, int32(8080), got["web-http-node-a"].Port)
	assert.Equal(t, int32(9090), got["web-http-node-a-9090"].Port)
	assert.Equal(t, "http", got["web-http-node-a-9090"].PortName)
	c.WaitProgrammed(t, ns+"/web", 80, p1, p2, p3)
	res := c.Requests(t, cluster.TrafficOptions{Service: ns + "/web", Port: 80, Count: 60})
	assert.Empty(t, res.Failed(), "%s", res)
	assert.Contains(t, res.Pods(), p3.Key(), "traffic reaches the pod on the other number")

	s3.Stop()
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-a":      {ip(p1): "TTF", ip(p2): "TTF"},
		"web-http-node-a-9090": {ip(p3): "FFF"},
	})
}

// switchRunner is a probe runner whose verdict per pod the test sets; for tests about
// publishing, not probing (nothing is dialled).
type switchRunner struct {
	mu   sync.Mutex
	fail map[string]bool
}

func (s *switchRunner) Run(_ context.Context, t scheduler.Target) scheduler.Outcome {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail[t.PodName] {
		return scheduler.Outcome{Reason: "switched off by the test"}
	}
	return scheduler.Outcome{Pass: true}
}

func (s *switchRunner) set(fail bool, pods ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range pods {
		s.fail[p] = fail
	}
}

// A burst of result changes within the coalescing window, with a budget of one reconcile per
// window, is at most two writes per slice: the leading one (the first change is published at
// once) and one trailing at the window's end.
func TestABurstOfChangesIsAtMostTwoWritesPerSlice(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "burst")
	labels := map[string]string{"app": "web"}
	var names []string
	want := map[string]string{}
	for i := range 10 {
		p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-" + string(rune('a'+i)), Node: "node-a", Labels: labels, ContainerPorts: vmPorts, ObjectOnly: true})
		names = append(names, p.Name)
		want[ip(p)] = "FFF"
	}
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080)), namedPort("smtp", 25, intstr.FromInt32(2525))},
		httpProbe(intstr.FromString("health"), 1, 1))
	runner := &switchRunner{fail: map[string]bool{}}
	// Probes run every second, spread over the period; a window longer than that gathers all
	// changes after the first into the trailing write.
	startAgent(t, c, "node-a", withRunner(runner), withWindow(3*time.Second), withBurst(1))
	ready := map[string]string{}
	for k := range want {
		ready[k] = "TTF"
	}
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": ready, "web-smtp-node-a": ready})
	w := watchSlices(t, c, ns)
	runner.set(true, names...)
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": want, "web-smtp-node-a": want})
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.Contains(ct, w.Events(), "MODIFIED web-http-node-a", "the watch saw the writes")
		assert.Contains(ct, w.Events(), "MODIFIED web-smtp-node-a", "the watch saw the writes")
	}, 10*time.Second, 50*time.Millisecond)
	perSlice := map[string]int{}
	for _, ev := range w.Events() {
		perSlice[ev]++
	}
	assert.Len(t, perSlice, 2, "only the two slices were modified: %v", w.Events())
	for ev, n := range perSlice {
		assert.LessOrEqual(t, n, 2, "%s: ten pods failing within a window are at most a leading and a trailing write", ev)
	}
}

// Changes of a resource one right after another's write are each published at once while the
// coalescing budget lasts: with a window of an hour, a change that waited for the window (as
// every second change within a window did with a budget of one) would not be published
// before the test's deadline.
func TestAChangeRightAfterAWriteIsPublishedWithoutWaitingForTheWindow(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "prompt")
	labels := map[string]string{"app": "web"}
	p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts, ObjectOnly: true})
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))}, httpProbe(intstr.FromInt32(8080), 1, 1))
	runner := &switchRunner{fail: map[string]bool{}}
	// The first result is a change too: with it, a budget of four leaves three.
	a := startAgent(t, c, "node-a", withRunner(runner), withWindow(time.Hour), withBurst(4))
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(p): "TTF"}})
	w := watchSlices(t, c, ns)
	updates := testutil.ToFloat64(a.Metrics.SliceWrites.WithLabelValues(metrics.OpUpdate))
	for i, fail := range []bool{true, false, true} {
		runner.set(fail, p.Name)
		want := "TTF"
		if fail {
			want = "FFF"
		}
		eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(p): want}})
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			assert.Len(ct, w.Events(), i+1, "one write per change")
		}, 10*time.Second, 50*time.Millisecond)
	}
	assert.Equal(t, []string{"MODIFIED web-http-node-a", "MODIFIED web-http-node-a", "MODIFIED web-http-node-a"}, w.Events())
	assert.Equal(t, updates+3, testutil.ToFloat64(a.Metrics.SliceWrites.WithLabelValues(metrics.OpUpdate)), "three updates, no retries")
}

// A slice name held by another object is never written; the agent records an Event and still
// publishes the rest.
func TestANameHeldByAnotherObjectIsNotWritten(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "taken")
	labels := map[string]string{"app": "web"}
	p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts, ObjectOnly: true})
	foreign := createForeignSlice(t, c, ns, "web-smtp-node-a")
	// Two live resources whose names collide: "web" + port "smtp-node" would be "web-smtp-node-node-a",
	// and "web-smtp" + port "node" is the same name.
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080)), namedPort("smtp", 25, intstr.FromInt32(2525)), namedPort("smtp-node", 26, intstr.FromInt32(2526))})
	startAgent(t, c, "node-a", withRunner(&switchRunner{fail: map[string]bool{}}))
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(p): "TTF"}, "web-smtp-node-node-a": {ip(p): "TTF"}})
	createResource(t, c, ns, "web-smtp", labels, []v1alpha1.ServicePort{namedPort("node", 80, intstr.FromInt32(8080)), namedPort("other", 81, intstr.FromInt32(8081))})
	eventuallySlices(t, c, ns, "web-smtp", map[string]map[string]string{"web-smtp-other-node-a": {ip(p): "TTF"}})

	eventuallyEvent(t, c, ns, agent.ReasonSliceNameTaken, "web: EndpointSlice web-smtp-node-a is held by a slice managed by someone-else")
	eventuallyEvent(t, c, ns, agent.ReasonSliceNameTaken, `web-smtp: EndpointSlice web-smtp-node-node-a is held by the slice of resource "web", port "smtp-node"`)

	got := &discoveryv1.EndpointSlice{}
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(foreign), got))
	assert.Equal(t, foreign.ResourceVersion, got.ResourceVersion, "the foreign slice was not written")
	assert.Empty(t, got.Endpoints)
	s, err := slicesOf(t.Context(), c, ns, "web")
	require.NoError(t, err)
	assert.Contains(t, s, "web-smtp-node-node-a", "the first resource keeps its slice")
}

// eventuallyEvent waits for an Event with the reason whose "<regarding>: <note>" contains text.
func eventuallyEvent(t *testing.T, c *cluster.Cluster, ns, reason, text string) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		var evs eventsv1.EventList
		require.NoError(ct, c.Env.Client.List(t.Context(), &evs, client.InNamespace(ns)))
		var msgs []string
		for _, e := range evs.Items {
			if e.Reason == reason {
				msgs = append(msgs, e.Regarding.Name+": "+e.Note)
			}
		}
		assert.Contains(ct, strings.Join(msgs, "\n"), text)
	}, time.Minute, 100*time.Millisecond)
}

// Targets come and go with pods and resources, and stopping the agent leaves no goroutine.
func TestTargetsFollowPodsAndResources(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "targets")
	labels := map[string]string{"app": "web"}
	p0 := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts, ObjectOnly: true})
	p1 := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-1", Node: "node-a", Labels: labels, ContainerPorts: vmPorts, ObjectOnly: true})
	swh := createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))},
		httpProbe(intstr.FromInt32(8080), 1, 3), tcpProbe(intstr.FromString("health"), 1, 3))
	a := startAgent(t, c, "node-a", withRunner(&switchRunner{fail: map[string]bool{}}))
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(p0): "TTF", ip(p1): "TTF"}})
	// The targets are declared to the scheduler after the slice write (development/AGENT.md):
	// the slice can be seen a moment before.
	require.Eventually(t, func() bool { return a.Scheduler.Len() == 4 }, time.Minute, 10*time.Millisecond, "two pods, two probes")

	p1.Delete(t)
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(p0): "TTF"}})
	require.Eventually(t, func() bool { return a.Scheduler.Len() == 2 }, time.Minute, 10*time.Millisecond, "the deleted pod's two targets go")

	require.NoError(t, c.Env.Client.Delete(t.Context(), swh))
	require.Eventually(t, func() bool { return a.Scheduler.Len() == 0 }, time.Minute, 50*time.Millisecond)
	assert.Equal(t, 0.0, testutil.ToFloat64(a.Metrics.Targets))
	assert.Equal(t, 0.0, testutil.ToFloat64(a.Metrics.Endpoints.WithLabelValues(metrics.StateReady)))
}

// An agent that probed real servers leaves no goroutine (workers, probes, connections, watches)
// once its pods and resource are gone and it has stopped.
func TestAStoppedAgentLeavesNoGoroutine(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "leak")
	labels := map[string]string{"app": "web"}
	before := goleak.IgnoreCurrent()
	p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	p.ServeHTTP(t, 8080)
	p.ServeSMTP(t, 2525)
	swh := createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080)), namedPort("smtp", 25, intstr.FromInt32(2525))},
		httpProbe(intstr.FromInt32(8080), 1, 3), tcpProbe(intstr.FromInt32(2525), 1, 3))
	a := startAgent(t, c, "node-a")
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(p): "TTF"}, "web-smtp-node-a": {ip(p): "TTF"}})
	start := a.probeRuns()
	require.Eventually(t, func() bool { return a.probeRuns() >= start+4 }, time.Minute, 50*time.Millisecond)

	require.NoError(t, c.Env.Client.Delete(t.Context(), swh))
	require.Eventually(t, func() bool { return a.Scheduler.Len() == 0 }, time.Minute, 50*time.Millisecond)
	p.Delete(t)
	a.stop()
	goleak.VerifyNone(t, before,
		// Idle keep-alive connections of client-go's shared HTTP transport to the API server.
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}

// The agent serves /healthz, /readyz and its metrics on loopback addresses.
func TestTheAgentServesHealthAndMetricsOnLoopback(t *testing.T) {
	// The served registry is process-wide and the agent's metrics register once.
	if !globalRegistryFree.CompareAndSwap(true, false) {
		t.Skip("the process-wide metrics registry is taken by an earlier run (-count > 1)")
	}
	c := testCluster(t)
	health, metricsAddr := freeAddr(t), freeAddr(t)
	startAgent(t, c, "node-b", func(o *agent.Options) {
		o.HealthProbeBindAddress, o.MetricsBindAddress = health, metricsAddr
		o.Registry = nil // controller-runtime's registry, the one the endpoint serves
	})
	for _, path := range []string{"/healthz", "/readyz"} {
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			code, _ := get(t, "http://"+health+path)
			assert.Equal(ct, http.StatusOK, code, path)
		}, time.Minute, 50*time.Millisecond)
	}
	code, body := get(t, "http://"+metricsAddr+"/metrics")
	require.Equal(t, http.StatusOK, code)
	for _, m := range []string{"swh_agent_probe_targets", "swh_agent_endpoints", "swh_agent_probe_scheduling_lag_seconds"} {
		assert.Contains(t, body, m)
	}
}

var globalRegistryFree = func() *atomic.Bool { var b atomic.Bool; b.Store(true); return &b }()

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := loopback.FreeAddr()
	require.NoError(t, err)
	return addr
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
