// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// Timing of the scenarios. Probes run every second; a port flips after failureThreshold
// failures.
const (
	// periodSeconds of every resource here.
	periodSeconds = 1
	// failureThreshold of every probe here.
	failureThreshold = 2
	// minInWindow is the fewest requests a loop must send inside the window of an event (the
	// loop sends one every 10 ms, so a window of a second holds about a hundred).
	minInWindow = 50
	// waitFor bounds every wait for a published state (well over 3x a probe decision).
	waitFor = time.Minute
	// poll is the polling interval of those waits.
	poll = 50 * time.Millisecond
	// loopFor bounds every background request loop; tests stop theirs long before.
	loopFor = 10 * time.Minute
)

// kit holds the shared e2e helpers with this suite's timing.
var kit = e2e.Timing{
	PeriodSeconds: periodSeconds, FailureThreshold: failureThreshold, MinInWindow: minInWindow, WaitFor: waitFor, Poll: poll,
}

func ip(p *cluster.Pod) string { return p.IP.String() }

// vmPorts are the container ports of the "VM" pods: web (HTTP) and smtp.
var vmPorts = []corev1.ContainerPort{
	{Name: "web", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
	{Name: "smtp", ContainerPort: 2525, Protocol: corev1.ProtocolTCP},
}

// webPorts are the container ports of plain web pods.
var webPorts = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}

// createResource creates the resource and waits until the controller has made its Service
// (requests go to that Service's ClusterIP).
func createResource(t testing.TB, c *cluster.Cluster, swh *v1alpha1.ServiceWithHealthchecks) {
	t.Helper()
	require.NoError(t, c.Env.Client.Create(t.Context(), swh))
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		svc := &corev1.Service{}
		require.NoError(ct, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(swh), svc))
		assert.NotEmpty(ct, svc.Spec.ClusterIP)
		assert.Empty(ct, svc.Spec.Selector)
	}, waitFor, poll, "the controller creates the Service of %s", swh.Name)
}

// sliceChange is one event of a slice watch with the endpoint conditions it carried.
type sliceChange struct {
	At        time.Time
	Type      watch.EventType
	Slice     string
	Endpoints map[string]string // address -> "RST"
}

// sliceWatch records every change of the EndpointSlices of a namespace from the moment it
// starts, with each endpoint's conditions.
type sliceWatch struct {
	mu      sync.Mutex
	initial map[string]map[string]string
	changes []sliceChange
}

// watchSlices lists the namespace's slices and watches them from that list's resourceVersion,
// so no change after the returned initial state is missed.
func watchSlices(t testing.TB, c *cluster.Cluster, ns string) *sliceWatch {
	t.Helper()
	wc, err := client.NewWithWatch(c.Env.Config, client.Options{Scheme: c.Env.Scheme})
	require.NoError(t, err)
	var list discoveryv1.EndpointSliceList
	require.NoError(t, c.Env.Client.List(t.Context(), &list, client.InNamespace(ns)))
	sw := &sliceWatch{initial: map[string]map[string]string{}}
	for _, s := range list.Items {
		sw.initial[s.Name] = e2e.SliceEndpoints(&s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := wc.Watch(ctx, &discoveryv1.EndpointSliceList{}, client.InNamespace(ns),
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion, AllowWatchBookmarks: true}})
	if err != nil {
		cancel()
		require.NoError(t, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				sw.mu.Lock()
				sw.changes = append(sw.changes, sliceChange{At: time.Now(), Type: ev.Type, Slice: fmt.Sprintf("watch error: %v", ev.Object)})
				sw.mu.Unlock()
				continue
			}
			s, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok || ev.Type == watch.Bookmark {
				continue
			}
			sw.mu.Lock()
			sw.changes = append(sw.changes, sliceChange{At: time.Now(), Type: ev.Type, Slice: s.Name, Endpoints: e2e.SliceEndpoints(s)})
			sw.mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.Stop(); cancel(); <-done })
	return sw
}

// Initial is the namespace's slices when the watch started.
func (w *sliceWatch) Initial() map[string]map[string]string { return w.initial }

// Changes returns every event seen so far.
func (w *sliceWatch) Changes() []sliceChange {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]sliceChange(nil), w.changes...)
}

// ConditionChanges lists, in order, every change of an endpoint's conditions, and every
// endpoint added or removed (also by a slice created or deleted), relative to the state before
// that event: "<slice>: <address> TTF -> FFF".
func (w *sliceWatch) ConditionChanges() []string {
	return w.ConditionChangesBefore(time.Now().Add(time.Hour))
}

// ConditionChangesBefore is ConditionChanges of the events received before t.
func (w *sliceWatch) ConditionChangesBefore(t time.Time) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	state := map[string]map[string]string{}
	for name, eps := range w.initial {
		state[name] = eps
	}
	var out []string
	for _, ch := range w.changes {
		if !ch.At.Before(t) {
			break
		}
		if ch.Type == watch.Error {
			out = append(out, ch.Slice)
			continue
		}
		before := state[ch.Slice]
		after := ch.Endpoints
		if ch.Type == watch.Deleted {
			after = nil
		}
		for _, d := range diffEndpoints(before, after) {
			out = append(out, ch.Slice+": "+d)
		}
		if after == nil {
			delete(state, ch.Slice)
		} else {
			state[ch.Slice] = after
		}
	}
	return out
}

func diffEndpoints(before, after map[string]string) []string {
	keys := map[string]struct{}{}
	for k := range before {
		keys[k] = struct{}{}
	}
	for k := range after {
		keys[k] = struct{}{}
	}
	var out []string
	for k := range keys {
		b, okB := before[k]
		a, okA := after[k]
		switch {
		case !okB:
			out = append(out, k+" added "+a)
		case !okA:
			out = append(out, k+" removed (was "+b+")")
		case a != b:
			out = append(out, k+" "+b+" -> "+a)
		}
	}
	sort.Strings(out)
	return out
}

// between returns the requests that started in [from, to).
func between(r cluster.Results, from, to time.Time) cluster.Results {
	return r.Since(from).Before(to)
}

// logTimelineOnFailure logs, when the test fails, every slice change the watch saw and the
// span of the loop's failed requests, with times, to tell which change the failures followed.
func logTimelineOnFailure(t *testing.T, w *sliceWatch, loop *cluster.Traffic) {
	t.Helper()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		var b strings.Builder
		for _, ch := range w.Changes() {
			fmt.Fprintf(&b, "\n  %s %s %s %v", ch.At.Format("15:04:05.000"), ch.Type, ch.Slice, ch.Endpoints)
		}
		t.Logf("slice changes:%s", b.String())
		res := loop.Results()
		if f := res.Failed(); len(f) > 0 {
			t.Logf("failed requests: %d of %d, from %s to %s", len(f), len(res), f[0].Start.Format("15:04:05.000"), f[len(f)-1].Start.Format("15:04:05.000"))
		}
	})
}
