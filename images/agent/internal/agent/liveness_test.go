// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/loopback"
	promtext "github.com/deckhouse/service-with-healthchecks/testkit/metrics"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

// The liveness tests run real agents (in this process, renewing their node Leases) against the
// real controller program (built from images/controller and started as a process: its
// packages are internal to another module) with a short grace. See development/LIVENESS.md.

// livenessGrace is the controller's --agent-lost-grace in these tests.
const livenessGrace = 4 * time.Second

// withLease makes the agent renew its node Lease in ns every 500 ms, as the agent program does
// every 10 s (the interval is shortened to fit the short grace).
func withLease(t *testing.T, c *cluster.Cluster, ns, node string) agentOpt {
	t.Helper()
	return func(o *agent.Options) {
		o.LeaseNamespace = ns
		o.LeaseRenewInterval = 500 * time.Millisecond
	}
}

// controllerProcess is the controller program running against the cluster's API server.
type controllerProcess struct {
	metricsAddr string
	proc        *process.Process
}

// startController runs the controller program (built once per test binary: process.Build)
// with the liveness runner judging the Leases of leaseNS with livenessGrace; it is stopped (by
// its PID) when the test ends. Leader election is off (unless extraArgs turn it on): a frozen
// API server must not make it lose leadership and exit.
func startController(t *testing.T, c *cluster.Cluster, leaseNS string, extraArgs ...string) *controllerProcess {
	t.Helper()
	bin, err := process.Build("images/controller", "./cmd/controller")
	require.NoError(t, err)
	dir := t.TempDir()
	kubeconfig, err := c.Env.WriteKubeConfig(dir)
	require.NoError(t, err)
	metricsAddr, err := loopback.FreeAddr()
	require.NoError(t, err)

	cmd := exec.Command(bin, "--kubeconfig="+kubeconfig, "--metrics-bind-address="+metricsAddr, //nolint:gosec // our own binary
		"--health-probe-bind-address=0", "--leader-elect=false", "--agent-lease-namespace="+leaseNS,
		"--agent-lost-grace="+livenessGrace.String())
	cmd.Args = append(cmd.Args, extraArgs...) // later flags win
	cmd.Env = append(os.Environ(), "KUBECONFIG=")
	p := &controllerProcess{metricsAddr: metricsAddr, proc: process.StartForTest(t, "controller", cmd)}
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		_, err := p.metric(t.Context(), "swh_controller_withdrawn_slices_total")
		assert.NoError(ct, err)
	}, 60*time.Second, 100*time.Millisecond, "the controller serves its metrics")
	return p
}

// stop stops the controller (SIGTERM to its PID) and waits until its process is gone.
func (p *controllerProcess) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.proc.Stop(), "the controller exits on SIGTERM")
}

// exited tells whether the controller's process is gone (and reaped).
func (p *controllerProcess) exited() bool { return p.proc.Exited() }

// metric reads a metric of the controller: name is the metric's name with its labels as
// exposed, e.g. `x_total{reason="a"}`.
func (p *controllerProcess) metric(ctx context.Context, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	fams, err := promtext.Get(ctx, p.metricsAddr)
	if err != nil {
		return 0, fmt.Errorf("scraping the controller: %w", err)
	}
	return fams.Value(name)
}

// metricIs reports whether the metric reads want; a failed scrape (a busy machine) reads as
// not yet, so it can be polled from require.Eventually, whose condition must not call FailNow.
func (p *controllerProcess) metricIs(t *testing.T, name string, want float64) bool {
	v, err := p.metric(t.Context(), name)
	return err == nil && v == want
}

func (p *controllerProcess) requireMetric(t *testing.T, name string) float64 {
	t.Helper()
	v, err := p.metric(t.Context(), name)
	require.NoError(t, err)
	return v
}

// endpointEvent is one endpoint of a slice as a watch event showed it.
type endpointEvent struct {
	at    time.Time
	slice string
	ip    string
	rst   string
}

// endpointWatch records every endpoint of every slice event of a namespace, from a watch opened
// at once; if the watch ends, it is reopened from the last seen resourceVersion (so no change is
// missed).
type endpointWatch struct {
	mu     sync.Mutex
	events []endpointEvent
	errs   []string
}

func watchEndpoints(t *testing.T, c *cluster.Cluster, ns string) *endpointWatch {
	t.Helper()
	wc, err := client.NewWithWatch(c.Env.Config, client.Options{Scheme: c.Env.Scheme})
	require.NoError(t, err)
	var list discoveryv1.EndpointSliceList
	require.NoError(t, c.Env.Client.List(t.Context(), &list, client.InNamespace(ns)))
	ew := &endpointWatch{}
	w, err := wc.Watch(t.Context(), &discoveryv1.EndpointSliceList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	// The goroutine owns w (it replaces it when a watch ends) and stops it itself: the cleanup
	// only cancels and waits, so it never touches a watcher that is being replaced.
	go func() {
		defer close(done)
		rv := list.ResourceVersion
		for {
			rv = ew.record(ctx, w, rv)
			w.Stop()
			for {
				if ctx.Err() != nil {
					return
				}
				next, werr := wc.Watch(ctx, &discoveryv1.EndpointSliceList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
				if werr == nil {
					w = next
					break
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ew
}

// record appends the endpoints of every slice event of wi until the watch ends or ctx is done,
// and returns the last resourceVersion seen (to resume from).
func (w *endpointWatch) record(ctx context.Context, wi watch.Interface, rv string) string {
	for {
		var ev watch.Event
		var open bool
		select {
		case <-ctx.Done():
			return rv
		case ev, open = <-wi.ResultChan():
		}
		if !open {
			return rv
		}
		if ev.Type == watch.Error {
			w.mu.Lock()
			w.errs = append(w.errs, fmt.Sprintf("%v", ev.Object))
			w.mu.Unlock()
			continue
		}
		s, ok := ev.Object.(*discoveryv1.EndpointSlice)
		if !ok {
			continue
		}
		rv = s.ResourceVersion
		if ev.Type == watch.Bookmark {
			continue
		}
		w.mu.Lock()
		for _, e := range s.Endpoints {
			w.events = append(w.events, endpointEvent{at: time.Now(), slice: s.Name, ip: e.Addresses[0],
				rst: tf(e.Conditions.Ready) + tf(e.Conditions.Serving) + tf(e.Conditions.Terminating)})
		}
		w.mu.Unlock()
	}
}

// of returns the recorded conditions of one endpoint, in order.
func (w *endpointWatch) of(ip string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, e := range w.events {
		if e.ip == ip {
			out = append(out, e.rst)
		}
	}
	return out
}

func (w *endpointWatch) errors() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.errs...)
}

// Issue 7, test 1: an agent that stops renewing its Lease has its node's endpoints withdrawn
// by the controller after the grace (still ready at half of it), the slice kept; started again,
// the agent republishes them ready after its own decisive results. The other node is untouched.
func TestAStoppedAgentsEndpointsAreWithdrawnAfterTheGraceAndReturnWithIt(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "lost")
	labels := map[string]string{"app": "web"}
	a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-a", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-b", Node: "node-b", Labels: labels, ContainerPorts: vmPorts})
	a.ServeHTTP(t, 8080)
	b.ServeHTTP(t, 8080)
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))}, httpProbe(intstr.FromInt32(8080), 1, 2))
	ctl := startController(t, c, ns)
	startAgent(t, c, "node-a", withLease(t, c, ns, "node-a"))
	agentB := startAgent(t, c, "node-b", withLease(t, c, ns, "node-b"))
	bothReady := map[string]map[string]string{"web-http-node-a": {ip(a): "TTF"}, "web-http-node-b": {ip(b): "TTF"}}
	eventuallySlices(t, c, ns, "web", bothReady)
	require.Eventually(t, func() bool { return ctl.metricIs(t, "swh_controller_agents_known", 2) }, 30*time.Second, 100*time.Millisecond,
		"the controller sees both agents")

	agentB.stop()
	require.Never(t, func() bool {
		got, err := slicesOf(t.Context(), c, ns, "web")
		return err == nil && got["web-http-node-b"].Endpoints[ip(b)] != "TTF"
	}, livenessGrace/2, 100*time.Millisecond, "a silent agent's endpoints stay ready within the grace")
	got := eventuallySlices(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-a": {ip(a): "TTF"},
		"web-http-node-b": {ip(b): "FFF"},
	})
	assert.Equal(t, map[string]string{ip(b): "web-b"}, got["web-http-node-b"].Pods, "the withdrawn slice keeps its endpoint for the returning agent")
	// The controller counts a withdrawal after its write returns, which the slice's watch may
	// show first: poll the counter (it must reach exactly 1, not more).
	require.Eventually(t, func() bool { return ctl.metricIs(t, "swh_controller_withdrawn_slices_total", 1) }, 10*time.Second, 50*time.Millisecond,
		"the withdrawal is counted once")

	startAgent(t, c, "node-b", withLease(t, c, ns, "node-b"))
	eventuallySlices(t, c, ns, "web", bothReady)
	assert.Equal(t, 1.0, ctl.requireMetric(t, "swh_controller_withdrawn_slices_total"), "the returning agent is not withdrawn again")
}

// Issue 7, test 3: the API server frozen (SIGSTOP) for twice the grace and then resumed. No
// endpoint of a live agent ever leaves ready (watched from before the freeze), a probe result
// that changed during the freeze is published after it, and the controller, blind meanwhile
// (its Lease lists failed), withdrew nothing.
func TestAnAPIOutageWithdrawsNothingAndTheAgentsPublishAfterIt(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "outage")
	labels := map[string]string{"app": "web"}
	a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-a", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-b", Node: "node-b", Labels: labels, ContainerPorts: vmPorts})
	b2 := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-b2", Node: "node-b", Labels: labels, ContainerPorts: vmPorts})
	a.ServeHTTP(t, 8080)
	b.ServeHTTP(t, 8080)
	srvB2 := b2.ServeHTTP(t, 8080)
	w := watchEndpoints(t, c, ns)
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))}, httpProbe(intstr.FromInt32(8080), 1, 2))
	ctl := startController(t, c, ns)
	startAgent(t, c, "node-a", withLease(t, c, ns, "node-a"))
	startAgent(t, c, "node-b", withLease(t, c, ns, "node-b"))
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-a": {ip(a): "TTF"},
		"web-http-node-b": {ip(b): "TTF", ip(b2): "TTF"},
	})
	require.Eventually(t, func() bool { return ctl.metricIs(t, "swh_controller_agents_known", 2) }, 30*time.Second, 100*time.Millisecond,
		"the controller sees both agents")
	require.Eventually(t, func() bool { return slices.Contains(w.of(ip(a)), "TTF") && slices.Contains(w.of(ip(b)), "TTF") }, 30*time.Second, 50*time.Millisecond,
		"the watch shows the endpoints ready before the freeze")
	errorsBefore := ctl.requireMetric(t, "swh_controller_withdraw_errors_total")
	require.Equal(t, 0.0, ctl.requireMetric(t, "swh_controller_withdrawn_slices_total"))

	require.NoError(t, c.Env.Freeze())
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			assert.NoError(t, c.Env.Thaw())
		}
	})
	srvB2.Stop() // a probe result that changes while nobody can publish it
	// The outage itself: the API server stays stopped for twice the grace.
	<-time.After(2 * livenessGrace)
	require.NoError(t, c.Env.Thaw())
	thawed = true

	eventuallySlices(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-a": {ip(a): "TTF"},
		"web-http-node-b": {ip(b): "TTF", ip(b2): "FFF"},
	})
	require.Eventually(t, func() bool {
		v, err := ctl.metric(t.Context(), "swh_controller_withdraw_errors_total")
		return err == nil && v > errorsBefore
	}, 30*time.Second, 100*time.Millisecond, "the controller was blind during the freeze (its Lease lists failed)")
	// Give the controller more than a grace after the thaw to withdraw wrongly.
	require.Never(t, func() bool {
		got, err := slicesOf(t.Context(), c, ns, "web")
		return err == nil && (got["web-http-node-a"].Endpoints[ip(a)] != "TTF" || got["web-http-node-b"].Endpoints[ip(b)] != "TTF")
	}, livenessGrace+time.Second, 100*time.Millisecond, "live agents' endpoints stay ready after the outage")
	assert.Equal(t, 0.0, ctl.requireMetric(t, "swh_controller_withdrawn_slices_total"), "the controller withdrew nothing")
	assert.Equal(t, 2.0, ctl.requireMetric(t, "swh_controller_agents_known"), "the controller sees both agents again")

	assert.Empty(t, w.errors(), "the watch saw no errors")
	for _, p := range []*cluster.Pod{a, b} {
		// A new endpoint is first published not ready (no decisive result yet); from its
		// first ready on, it must never leave ready.
		seen := w.of(ip(p))
		first := slices.Index(seen, "TTF")
		require.GreaterOrEqual(t, first, 0, "the watch saw %s ready: %v", p.Key(), seen)
		for i, rst := range seen[first:] {
			assert.Equal(t, "TTF", rst, "%s in watch event %d of %v: a live agent's endpoint left ready", p.Key(), first+i, seen)
		}
	}
	assert.Contains(t, w.of(ip(b2)), "FFF", "the watch saw the change made during the freeze published")
}

// agentsStale reads the AgentsStale condition of a resource (zero when absent).
func agentsStale(ctx context.Context, c *cluster.Cluster, ns, name string) (metav1.Condition, error) {
	var swh v1alpha1.ServiceWithHealthchecks
	if err := c.Env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &swh); err != nil {
		return metav1.Condition{}, err
	}
	if cond := meta.FindStatusCondition(swh.Status.Conditions, v1alpha1.ConditionAgentsStale); cond != nil {
		return *cond, nil
	}
	return metav1.Condition{}, nil
}

// Issue 7, test 3, second half: more than half of the agents stopped at once (both of two),
// their last renewals a quarter of the grace apart, as out-of-phase renewals leave them.
// The controller judges them stale but the guard holds from the first one's grace on:
// nothing is withdrawn (no endpoint
// leaves ready in the watch opened before), the guard's metric is 1 and the resource's
// AgentsStale condition says why (WithdrawalHeld, naming the nodes); the agents started again,
// the condition clears and the metric drops.
func TestMoreThanHalfOfTheAgentsStoppedAtOnceWithdrawsNothingAndTheGuardSaysWhy(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "guard")
	labels := map[string]string{"app": "web"}
	a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-a", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-b", Node: "node-b", Labels: labels, ContainerPorts: vmPorts})
	a.ServeHTTP(t, 8080)
	b.ServeHTTP(t, 8080)
	w := watchEndpoints(t, c, ns)
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))}, httpProbe(intstr.FromInt32(8080), 1, 2))
	ctl := startController(t, c, ns)
	agentA := startAgent(t, c, "node-a", withLease(t, c, ns, "node-a"))
	agentB := startAgent(t, c, "node-b", withLease(t, c, ns, "node-b"))
	bothReady := map[string]map[string]string{"web-http-node-a": {ip(a): "TTF"}, "web-http-node-b": {ip(b): "TTF"}}
	eventuallySlices(t, c, ns, "web", bothReady)
	require.Eventually(t, func() bool { return ctl.metricIs(t, "swh_controller_agents_known", 2) }, 30*time.Second, 100*time.Millisecond,
		"the controller sees both agents")
	eventuallyAgentsStale := func(status metav1.ConditionStatus, reason, msg string) metav1.Condition {
		t.Helper()
		var got metav1.Condition
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			var err error
			got, err = agentsStale(t.Context(), c, ns, "web")
			require.NoError(ct, err)
			assert.Equal(ct, status, got.Status, got.Message)
			assert.Equal(ct, reason, got.Reason, got.Message)
		}, 60*time.Second, 100*time.Millisecond, msg)
		return got
	}
	eventuallyAgentsStale(metav1.ConditionFalse, "AgentsFresh", "with both agents renewing, the resource has no stale agent")

	// Both at once, as a fleet stops: agents that stop together do not go stale in the same
	// instant, their last renewals are out of phase by up to a renewal interval. Here they are
	// a second apart (a quarter of the grace, the chart's interval), renewed by the test after
	// both agents stopped: node-a goes stale while node-b's agent has been silent for three
	// quarters of the grace. Judged by the stale ones alone (1 of 2, not more than half),
	// node-a would be withdrawn before node-b goes stale; the guard counts node-b with it.
	stopAll(agentA, agentB)
	touchLeases(t, c, ns, "node-a")
	<-time.After(livenessGrace / 4)
	touchLeases(t, c, ns, "node-b")
	require.Eventually(t, func() bool { return ctl.metricIs(t, "swh_controller_liveness_guard_holding", 1) }, 30*time.Second, 100*time.Millisecond,
		"the guard holds once an agent is stale and both look stale")
	require.Eventually(t, func() bool { return ctl.metricIs(t, "swh_controller_agents_stale", 2) }, 30*time.Second, 100*time.Millisecond,
		"the controller judges both agents stale")
	eventuallyAgentsStale(metav1.ConditionTrue, "WithdrawalHeld", "the resource says why nothing is withdrawn")
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		held, err := agentsStale(t.Context(), c, ns, "web")
		require.NoError(ct, err)
		for _, want := range []string{"2 of 2 agents look stale", "nodes node-a, node-b", "withdraws nothing", "API server"} {
			assert.Contains(ct, held.Message, want)
		}
	}, 30*time.Second, 100*time.Millisecond, "the condition names both nodes once both are stale")
	// The guard keeps holding for another grace: still nothing withdrawn.
	require.Never(t, func() bool {
		got, err := slicesOf(t.Context(), c, ns, "web")
		return err == nil && (got["web-http-node-a"].Endpoints[ip(a)] != "TTF" || got["web-http-node-b"].Endpoints[ip(b)] != "TTF")
	}, livenessGrace, 100*time.Millisecond, "nothing is withdrawn while the guard holds")
	assert.Equal(t, 1.0, ctl.requireMetric(t, "swh_controller_liveness_guard_holding"))
	assert.Equal(t, 0.0, ctl.requireMetric(t, "swh_controller_withdrawn_slices_total"), "the controller withdrew nothing")

	startAgent(t, c, "node-a", withLease(t, c, ns, "node-a"))
	startAgent(t, c, "node-b", withLease(t, c, ns, "node-b"))
	eventuallyAgentsStale(metav1.ConditionFalse, "AgentsFresh", "the condition clears when the agents are back")
	assert.Equal(t, 0.0, ctl.requireMetric(t, "swh_controller_liveness_guard_holding"), "the guard no longer holds")
	eventuallySlices(t, c, ns, "web", bothReady)
	assert.Equal(t, 0.0, ctl.requireMetric(t, "swh_controller_withdrawn_slices_total"), "the controller withdrew nothing")

	assert.Empty(t, w.errors(), "the watch saw no errors")
	for _, p := range []*cluster.Pod{a, b} {
		seen := w.of(ip(p))
		first := slices.Index(seen, "TTF")
		require.GreaterOrEqual(t, first, 0, "the watch saw %s ready: %v", p.Key(), seen)
		for i, rst := range seen[first:] {
			assert.Equal(t, "TTF", rst, "%s in watch event %d of %v: an endpoint left ready while the guard held", p.Key(), first+i, seen)
		}
	}
}

// The untested case of the outage test: with leader election ON (as deployed), an API freeze
// longer than the leader's lease makes the controller lose leadership and exit; restarted (as
// its Deployment would), it leads again with the grace restarted. Nothing is withdrawn: no
// endpoint leaves ready in the watch opened before the freeze.
func TestALeaderThatLosesItsLeaseInAnAPIFreezeRestartsAndWithdrawsNothing(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "leader")
	labels := map[string]string{"app": "web"}
	a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-a", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-b", Node: "node-b", Labels: labels, ContainerPorts: vmPorts})
	a.ServeHTTP(t, 8080)
	b.ServeHTTP(t, 8080)
	w := watchEndpoints(t, c, ns)
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))}, httpProbe(intstr.FromInt32(8080), 1, 2))
	leaderArgs := []string{"--leader-elect=true", "--leader-election-namespace=" + ns}
	const leading = `leader_election_master_status{name="service-with-healthchecks-controller"}`
	ctl := startController(t, c, ns, leaderArgs...)
	startAgent(t, c, "node-a", withLease(t, c, ns, "node-a"))
	startAgent(t, c, "node-b", withLease(t, c, ns, "node-b"))
	bothReady := map[string]map[string]string{"web-http-node-a": {ip(a): "TTF"}, "web-http-node-b": {ip(b): "TTF"}}
	eventuallySlices(t, c, ns, "web", bothReady)
	require.Eventually(t, func() bool { return ctl.metricIs(t, leading, 1) }, 60*time.Second, 100*time.Millisecond, "the controller leads")
	require.Eventually(t, func() bool { return ctl.metricIs(t, "swh_controller_agents_known", 2) }, 30*time.Second, 100*time.Millisecond,
		"the controller sees both agents")

	require.NoError(t, c.Env.Freeze())
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			assert.NoError(t, c.Env.Thaw())
		}
	})
	// The freeze lasts until the leader, unable to renew its Lease, has given up and exited
	// (the renew deadline is 10 s, much longer than the 4 s grace); nobody signalled it.
	require.Eventually(t, ctl.exited, 2*time.Minute, 100*time.Millisecond, "the leader exits once it cannot renew its Lease")
	require.NoError(t, c.Env.Thaw())
	thawed = true

	ctl = startController(t, c, ns, leaderArgs...)
	require.Eventually(t, func() bool { return ctl.metricIs(t, leading, 1) }, 60*time.Second, 100*time.Millisecond, "the restarted controller leads")
	require.Eventually(t, func() bool { return ctl.metricIs(t, "swh_controller_agents_known", 2) }, 30*time.Second, 100*time.Millisecond,
		"the restarted controller sees both agents")
	// More than a grace of the new term: the agents renew, nothing is withdrawn.
	require.Never(t, func() bool {
		got, err := slicesOf(t.Context(), c, ns, "web")
		return err == nil && (got["web-http-node-a"].Endpoints[ip(a)] != "TTF" || got["web-http-node-b"].Endpoints[ip(b)] != "TTF")
	}, livenessGrace+time.Second, 100*time.Millisecond, "live agents' endpoints stay ready")
	assert.Equal(t, 0.0, ctl.requireMetric(t, "swh_controller_withdrawn_slices_total"), "the new term withdrew nothing")
	assert.Equal(t, 0.0, ctl.requireMetric(t, "swh_controller_liveness_guard_holding"))

	assert.Empty(t, w.errors(), "the watch saw no errors")
	for _, p := range []*cluster.Pod{a, b} {
		seen := w.of(ip(p))
		first := slices.Index(seen, "TTF")
		require.GreaterOrEqual(t, first, 0, "the watch saw %s ready: %v", p.Key(), seen)
		for i, rst := range seen[first:] {
			assert.Equal(t, "TTF", rst, "%s in watch event %d of %v: an endpoint left ready", p.Key(), first+i, seen)
		}
	}
}

// touchLeases renews the agent Leases of nodes in ns once, back to back, as the admin.
func touchLeases(t *testing.T, c *cluster.Cluster, ns string, nodes ...string) {
	t.Helper()
	now := metav1.NewMicroTime(time.Now())
	for _, node := range nodes {
		var l coordinationv1.Lease
		require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: wellknown.AgentLeaseName(node)}, &l))
		l.Spec.RenewTime = &now
		require.NoError(t, c.Env.Client.Update(t.Context(), &l), "renewing the Lease of %s", node)
	}
}
