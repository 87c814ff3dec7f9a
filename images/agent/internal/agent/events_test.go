// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// eventWrite is one write of an Event the API server showed in a watch.
type eventWrite struct {
	op        watch.EventType
	name      string
	reason    string
	regarding string
	related   string
	note      string
	series    int32
}

// eventWatch records every write of events.k8s.io Events in a namespace, from a watch opened at
// once.
type eventWatch struct {
	mu     sync.Mutex
	writes []eventWrite
}

func watchEvents(t *testing.T, c *cluster.Cluster, ns string) *eventWatch {
	t.Helper()
	wc, err := client.NewWithWatch(c.Env.Config, client.Options{Scheme: c.Env.Scheme})
	require.NoError(t, err)
	var list eventsv1.EventList
	require.NoError(t, c.Env.Client.List(t.Context(), &list, client.InNamespace(ns)))
	w, err := wc.Watch(t.Context(), &eventsv1.EventList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	require.NoError(t, err)
	ew := &eventWatch{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			e, ok := ev.Object.(*eventsv1.Event)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			wr := eventWrite{op: ev.Type, name: e.Name, reason: e.Reason, regarding: e.Regarding.Name, note: e.Note, series: 1}
			if e.Related != nil {
				wr.related = e.Related.Name
			}
			if e.Series != nil {
				wr.series = e.Series.Count
			}
			ew.mu.Lock()
			ew.writes = append(ew.writes, wr)
			ew.mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return ew
}

// regarding returns the writes of Events regarding an object (a pod, a resource) with a reason.
func (w *eventWatch) regarding(name, reason string) []eventWrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []eventWrite
	for _, e := range w.writes {
		if e.regarding == name && e.reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// about returns the writes of Events related to a pod, optionally with one reason.
func (w *eventWatch) about(pod, reason string) []eventWrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []eventWrite
	for _, e := range w.writes {
		if e.related == pod && (reason == "" || e.reason == reason) {
			out = append(out, e)
		}
	}
	return out
}

// The agent's readiness-transition Events are rate-limited (development/AGENT.md): the Events of one
// resource, pod and reason are aggregated into one Event whose series counts the repeats, so a
// target flapping every probe period makes at most two writes per reason (the Event, then its
// series) however often it flaps, while every transition is still published in the slice and
// counted in swh_agent_probe_transitions_total. Another pod's transition is not swallowed by
// the flapping pod's series: it gets its own Event with its own message.
func TestReadinessEventsAreRateLimitedPerPod(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "events")
	labels := map[string]string{"app": "web"}
	flap := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "flap", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	calm := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "calm", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	flapSrv := flap.ServeHTTP(t, 8080)
	calmSrv := calm.ServeHTTP(t, 8080)
	events := watchEvents(t, c, ns)
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))}, httpProbe(intstr.FromInt32(8080), 1, 1))
	a := startAgent(t, c, "node-a")
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(flap): "TTF", ip(calm): "TTF"}})
	transitions := func() float64 {
		return testutil.ToFloat64(a.Metrics.ProbeTransitions.WithLabelValues(string(v1alpha1.ProbeModeHTTP), "Fail")) +
			testutil.ToFloat64(a.Metrics.ProbeTransitions.WithLabelValues(string(v1alpha1.ProbeModeHTTP), "Pass"))
	}
	before := transitions()

	// Flap: every state lasts until the agent has published it (about one probe period).
	const flaps = 4
	for range flaps {
		flapSrv.SetHTTPStatus(http.StatusServiceUnavailable)
		eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(flap): "FFF", ip(calm): "TTF"}})
		flapSrv.SetHTTPStatus(http.StatusOK)
		eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(flap): "TTF", ip(calm): "TTF"}})
	}
	assert.GreaterOrEqual(t, transitions()-before, float64(2*flaps), "the flapping target's transitions happened and were counted")

	// The first transition of each kind is an Event, the second turns it into a series of two;
	// the later ones are only counted in memory.
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		for _, reason := range []string{agent.ReasonPortNotReady, agent.ReasonPortReady} {
			w := events.about("flap", reason)
			if assert.NotEmpty(ct, w, reason) {
				assert.Equal(ct, int32(2), w[len(w)-1].series, "%s: %+v", reason, w)
			}
		}
	}, time.Minute, 100*time.Millisecond, "the flapping pod's Events became series")
	// Nothing more is written for the flapping pod (the writes are asynchronous: give them time).
	require.Never(t, func() bool { return len(events.about("flap", "")) > 4 }, 2*time.Second, 100*time.Millisecond,
		"at most two writes per reason for a pod flapping %d times", flaps)
	for _, reason := range []string{agent.ReasonPortNotReady, agent.ReasonPortReady} {
		w := events.about("flap", reason)
		names := map[string]bool{}
		for _, e := range w {
			names[e.name] = true
		}
		assert.Len(t, names, 1, "one %s Event for the flapping pod: %+v", reason, w)
		assert.Len(t, w, 2, "%s: created, then its series; %+v", reason, w)
	}
	notReady := events.about("flap", agent.ReasonPortNotReady)
	require.NotEmpty(t, notReady)
	assert.Contains(t, notReady[0].note, "pod flap, port http: probe 0 (HTTP): HTTP 503", "the first transition's message")

	// Another pod of the same resource failing now gets an Event of its own, with its message.
	calmSrv.SetHTTPStatus(http.StatusServiceUnavailable)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		w := events.about("calm", agent.ReasonPortNotReady)
		if assert.Len(ct, w, 1) {
			assert.Contains(ct, w[0].note, "pod calm, port http:")
		}
	}, time.Minute, 100*time.Millisecond, "the other pod's transition is an Event of its own")
}

// The rate limit is per pod and port: a pod going out on a second port while the Event of its
// first is still tracked by the events broadcaster gets an Event of its own, with its own note.
// (With the same action for every port, client-go merged the second into a series of the
// first, whose note names the first port: the second port's reason was nowhere in the Events.)
func TestASecondPortOfAPodGetsAnEventOfItsOwn(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "events-ports")
	labels := map[string]string{"app": "web"}
	pod := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "two", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	first := pod.ServeHTTP(t, 8080)
	second := pod.ServeHTTP(t, 8081)
	events := watchEvents(t, c, ns)
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{
		namedPort("first", 80, intstr.FromInt32(8080)), namedPort("second", 81, intstr.FromInt32(8081)),
	}, httpProbe(intstr.FromInt32(8080), 1, 1), httpProbe(intstr.FromInt32(8081), 1, 1))
	startAgent(t, c, "node-a")
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-first-node-a": {ip(pod): "TTF"}, "web-second-node-a": {ip(pod): "TTF"}})

	first.SetHTTPStatus(http.StatusServiceUnavailable)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.Len(ct, events.about("two", agent.ReasonPortNotReady), 1)
	}, time.Minute, 100*time.Millisecond, "the first port's Event")
	second.SetHTTPStatus(http.StatusInternalServerError)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		names := map[string]string{}
		for _, e := range events.about("two", agent.ReasonPortNotReady) {
			names[e.name] = e.note
		}
		assert.Len(ct, names, 2, "two Events: %v", names)
		var notes []string
		for _, n := range names {
			notes = append(notes, n)
		}
		assert.Contains(ct, strings.Join(notes, "\n"), "pod two, port first: probe 0 (HTTP): HTTP 503")
		assert.Contains(ct, strings.Join(notes, "\n"), "pod two, port second: probe 1 (HTTP): HTTP 500")
	}, time.Minute, 100*time.Millisecond, "the second port's Event is its own, with its note")
}
