// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/scheduler"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// The agent records what it wrote, never what it only meant to write: these tests fail on an
// agent that records Events and gauges before (or without) the write.

// refuseSliceUpdates makes the API server refuse every update of the resource's slices in ns
// (a ValidatingAdmissionPolicy, the real admission path) until the returned function lifts it.
func refuseSliceUpdates(t *testing.T, c *cluster.Cluster, ns, resource string) (lift func()) {
	t.Helper()
	name := "refuse-" + ns
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{"discovery.k8s.io"}, APIVersions: []string{"v1"}, Resources: []string{"endpointslices"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: fmt.Sprintf("object.metadata.namespace != %q || object.metadata.?labels[%q].orValue('') != %q", ns, wellknown.LabelResource, resource),
				Message:    "refused by the test",
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), policy))
	require.NoError(t, c.Env.Client.Create(t.Context(), binding))
	lifted := false
	lift = func() {
		if lifted {
			return
		}
		lifted = true
		// Also run as a cleanup, when the test's context is done.
		require.NoError(t, client.IgnoreNotFound(c.Env.Client.Delete(context.Background(), binding)))
		require.NoError(t, client.IgnoreNotFound(c.Env.Client.Delete(context.Background(), policy)))
	}
	t.Cleanup(lift)
	return lift
}

// refused tells whether an update of the slice is refused now (a dry run, nothing is written).
func refused(t *testing.T, c *cluster.Cluster, ns, name string) bool {
	t.Helper()
	s := &discoveryv1.EndpointSlice{}
	if err := c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, s); err != nil {
		return false
	}
	s.Annotations["test/dry-run"] = "x"
	err := c.Env.Client.Update(t.Context(), s, client.DryRunAll)
	return err != nil && strings.Contains(err.Error(), "refused by the test")
}

// A transition whose slice write fails is not recorded; the retry that writes it records it.
// Before the fix, the agent recorded the Event before the write, and the retry recorded
// nothing.
func TestAFailedWriteRecordsNoEventAndItsRetryDoes(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "failedwrite")
	labels := map[string]string{"app": "web"}
	p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts, ObjectOnly: true})
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))}, httpProbe(intstr.FromInt32(8080), 1, 1))
	runner := &switchRunner{fail: map[string]bool{}}
	events := watchEvents(t, c, ns)
	a := startAgent(t, c, "node-a", withRunner(runner))
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(p): "TTF"}})

	lift := refuseSliceUpdates(t, c, ns, "web")
	require.Eventually(t, func() bool { return refused(t, c, ns, "web-http-node-a") }, time.Minute, 100*time.Millisecond,
		"the policy takes effect")
	failedBefore := testutil.ToFloat64(a.Metrics.SliceWriteErrors.WithLabelValues(metrics.OpUpdate))
	runner.set(true, p.Name)
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(a.Metrics.SliceWriteErrors.WithLabelValues(metrics.OpUpdate)) >= failedBefore+2
	}, time.Minute, 50*time.Millisecond, "the agent tried to publish the failure, and was refused, twice")
	assert.Never(t, func() bool { return len(events.about(p.Name, agent.ReasonPortNotReady)) > 0 }, 2*time.Second, 100*time.Millisecond,
		"a refused write records no transition")

	lift()
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(p): "FFF"}})
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		w := events.about(p.Name, agent.ReasonPortNotReady)
		if assert.Len(ct, w, 1, "the retry that wrote the slice records the transition once") {
			assert.Equal(ct, "pod web-0, port http: probe 0 (HTTP): switched off by the test", w[0].note)
		}
	}, time.Minute, 100*time.Millisecond)
}

// Endpoints of a slice the agent refused to write (its name is held by someone else) are not
// counted as published. Before the fix the gauge counted every desired endpoint.
func TestARefusedSliceIsNotCountedAsPublished(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "refusedcount")
	labels := map[string]string{"app": "web"}
	p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts, ObjectOnly: true})
	createForeignSlice(t, c, ns, "web-smtp-node-a")
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080)), namedPort("smtp", 25, intstr.FromInt32(2525))})
	a := startAgent(t, c, "node-a", withRunner(&switchRunner{fail: map[string]bool{}}))
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(p): "TTF"}})
	eventuallyEvent(t, c, ns, agent.ReasonSliceNameTaken, "web: EndpointSlice web-smtp-node-a is held by a slice managed by someone-else")
	require.Eventually(t, func() bool { return testutil.ToFloat64(a.Metrics.Endpoints.WithLabelValues(metrics.StateReady)) == 1 },
		10*time.Second, 50*time.Millisecond, "one endpoint is published (http); the smtp one is in no slice of ours")
	assert.GreaterOrEqual(t, testutil.ToFloat64(a.Metrics.SliceConflicts), 1.0, "the refusal was counted (once per reconcile that met it)")
}

// createForeignSlice creates an empty slice of another manager ("someone-else") named name.
func createForeignSlice(t *testing.T, c *cluster.Cluster, ns, name string) *discoveryv1.EndpointSlice {
	t.Helper()
	port, portName := int32(1), "smtp"
	foreign := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelManagedBy: "someone-else"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port}},
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), foreign))
	return foreign
}

// logLines collects the agent's log messages.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, prefix+" "+args)
	}, funcr.Options{Verbosity: 1})
}

// contains tells whether one line holds every part.
func (l *logLines) contains(parts ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

// The agent is neither ready nor publishing until it has read its Node, so the first write
// carries the node's zone; a relabelled node's new zone reaches the slices. Before the fix the
// agent published without a zone when its first read of the Node failed and rewrote every
// slice once a later read succeeded, and never followed a relabelled node.
func TestTheZoneIsRightFromTheFirstWriteAndFollowsTheNode(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "zone")
	node := "node-zone-" + ns[len(ns)-5:]
	labels := map[string]string{"app": "web"}
	// A pod object on a node the harness does not run (nothing dials it: no probes).
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-0", Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "testkit.invalid/pod", Ports: vmPorts}}},
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), pod))
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "198.18.250.9", PodIPs: []corev1.PodIP{{IP: "198.18.250.9"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	require.NoError(t, c.Env.Client.Status().Update(t.Context(), pod))
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))})
	writes := watchSlices(t, c, ns)

	health := freeAddr(t)
	logs := &logLines{}
	startAgent(t, c, node, func(o *agent.Options) {
		o.HealthProbeBindAddress = health
		o.Logger = logs.logger()
	})
	readyz := func() int {
		resp, err := http.Get("http://" + health + "/readyz")
		if err != nil {
			return 0
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	require.Eventually(t, func() bool { return logs.contains("not publishing: this agent's Node is not in the cache") }, time.Minute, 50*time.Millisecond,
		"the resource was reconciled without the Node")
	assert.Equal(t, http.StatusInternalServerError, readyz(), "not ready without its Node")
	assert.Empty(t, writes.Events(), "and nothing published")

	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{corev1.LabelTopologyZone: "zone-1"}}}
	require.NoError(t, c.Env.Client.Create(t.Context(), n))
	t.Cleanup(func() { _ = c.Env.Client.Delete(context.Background(), n) })
	got := eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-" + node: {"198.18.250.9": "TTF"}})
	assert.Equal(t, map[string]string{"198.18.250.9": "zone-1"}, got["web-http-"+node].Zones)
	require.Eventually(t, func() bool { return len(writes.Events()) > 0 }, time.Minute, 50*time.Millisecond, "the watch saw the write")
	assert.Equal(t, []string{"ADDED web-http-" + node}, writes.Events(), "one write, with the zone")
	require.Eventually(t, func() bool { return readyz() == http.StatusOK }, time.Minute, 50*time.Millisecond, "ready once the Node is read")

	n.Labels[corev1.LabelTopologyZone] = "zone-2"
	require.NoError(t, c.Env.Client.Update(t.Context(), n))
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		got, err := slicesOf(t.Context(), c, ns, "web")
		require.NoError(ct, err)
		assert.Equal(ct, map[string]string{"198.18.250.9": "zone-2"}, got["web-http-"+node].Zones)
	}, time.Minute, 50*time.Millisecond, "the new zone reaches the slice")
}

// reasonRunner fails every probe with the given reason (nothing is dialled).
type reasonRunner string

func (r reasonRunner) Run(context.Context, scheduler.Target) scheduler.Outcome {
	return scheduler.Outcome{Reason: string(r)}
}

// A probe reason longer than the events API accepts still makes an Event, its note cut to the
// limit. Before the fix the API server refused the Event and the transition went unreported.
func TestALongProbeReasonIsReportedWithItsNoteCut(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "longnote")
	labels := map[string]string{"app": "web"}
	p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts, ObjectOnly: true})
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))}, httpProbe(intstr.FromInt32(8080), 1, 1))
	events := watchEvents(t, c, ns)
	startAgent(t, c, "node-a", withRunner(reasonRunner(strings.Repeat("x", 3000))))
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(p): "FFF"}})
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		w := events.about(p.Name, agent.ReasonPortNotReady)
		if assert.NotEmpty(ct, w, "the transition is reported") {
			assert.LessOrEqual(ct, len(w[0].note), agent.MaxNoteBytes)
			assert.True(ct, strings.HasPrefix(w[0].note, "pod web-0, port http: probe 0 (HTTP): xxxx"), w[0].note)
		}
	}, time.Minute, 100*time.Millisecond)
}

// Many transitions of one resource at once are reported in one summary Event with the counts,
// not one Event each: Event writes follow slice writes (issue 19 part 4). Every transition is
// still counted in the metrics.
func TestManyTransitionsAtOnceAreOneSummaryEvent(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "summary")
	labels := map[string]string{"app": "web"}
	runner := &switchRunner{fail: map[string]bool{}}
	var names []string
	want := map[string]string{}
	for i := range 12 {
		p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: fmt.Sprintf("web-%02d", i), Node: "node-a", Labels: labels, ContainerPorts: vmPorts, ObjectOnly: true})
		names = append(names, p.Name)
		want[ip(p)] = "TTF"
	}
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))}, httpProbe(intstr.FromInt32(8080), 1, 1))
	events := watchEvents(t, c, ns)
	a := startAgent(t, c, "node-a", withRunner(runner), withWindow(3*time.Second))
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": want})

	runner.set(true, names...)
	for k := range want {
		want[k] = "FFF"
	}
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": want})
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(a.Metrics.PortTransitions.WithLabelValues("not_serving")) == 12
	}, time.Minute, 50*time.Millisecond, "every transition is counted")
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		var summaries []eventWrite
		events.mu.Lock()
		for _, e := range events.writes {
			if e.reason == agent.ReasonPortsChanged {
				summaries = append(summaries, e)
			}
		}
		events.mu.Unlock()
		if assert.NotEmpty(ct, summaries) {
			assert.Contains(ct, summaries[len(summaries)-1].note, "stopped serving")
		}
	}, time.Minute, 100*time.Millisecond, "a summary Event reports them")
	var notReady int
	for _, n := range names {
		notReady += len(events.about(n, agent.ReasonPortNotReady))
	}
	assert.Less(t, notReady, 12, "not one Event per transition")
	// The agent counts the summary once its Create has returned, so the Event's watch can show it
	// first: poll the counter (a race run read it as 0 right after the Event).
	assert.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.GreaterOrEqual(ct, testutil.ToFloat64(a.Metrics.TransitionEvents.WithLabelValues("summary")), 1.0)
	}, time.Minute, 50*time.Millisecond, "the summary Event is counted")
}
