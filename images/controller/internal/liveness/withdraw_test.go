// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package liveness

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/index"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/slicewrite"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

var env *controlplane.Env

// TestMain runs the tests with the informer-cache mutation detector on: the observer lists
// nodes and slices without copies.
func TestMain(m *testing.M) {
	controlplane.DetectCacheMutations()
	controlplane.Main(m, controlplane.Options{}, &env)
}

// slice is one of our slices of resource/port "http" on node, owned by uid, with one endpoint
// whose conditions are ready and serving.
func slice(ns, resource string, uid types.UID, node string, ready, serving *bool) discoveryv1.EndpointSlice {
	k := slicemeta.SliceKey{Resource: resource, Port: "http", Node: node}
	s := discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: k.Name(), Labels: k.Labels(), Annotations: k.Annotations(),
			OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference(resource, uid)},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"10.0.0.1"},
			NodeName:   ptr.To(node),
			Conditions: discoveryv1.EndpointConditions{Ready: ready, Serving: serving},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	return s
}

func TestPlan(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	owners := map[types.NamespacedName]types.UID{{Namespace: "ns", Name: "web"}: "uid-web"}
	foreign := slice("ns", "web", "uid-web", "n1", yes, yes)
	foreign.Labels[discoveryv1.LabelManagedBy] = "someone-else"
	tests := map[string]struct {
		slices []discoveryv1.EndpointSlice
		nodes  []string
		want   []string
	}{
		"a ready slice of a stale node is withdrawn": {
			slices: []discoveryv1.EndpointSlice{slice("ns", "web", "uid-web", "n1", yes, yes)},
			nodes:  []string{"n1"}, want: []string{"web-http-n1"},
		},
		"a slice of a fresh node is left alone": {
			slices: []discoveryv1.EndpointSlice{slice("ns", "web", "uid-web", "n2", yes, yes)},
			nodes:  []string{"n1"},
		},
		"nil conditions count as up and are withdrawn": {
			slices: []discoveryv1.EndpointSlice{slice("ns", "web", "uid-web", "n1", nil, nil)},
			nodes:  []string{"n1"}, want: []string{"web-http-n1"},
		},
		"a not-ready but serving endpoint is withdrawn": {
			slices: []discoveryv1.EndpointSlice{slice("ns", "web", "uid-web", "n1", no, yes)},
			nodes:  []string{"n1"}, want: []string{"web-http-n1"},
		},
		"an already withdrawn slice is not written again": {
			slices: []discoveryv1.EndpointSlice{slice("ns", "web", "uid-web", "n1", no, no)},
			nodes:  []string{"n1"},
		},
		"a slice of a deleted resource of the same name is not ours": {
			slices: []discoveryv1.EndpointSlice{slice("ns", "web", "uid-old", "n1", yes, yes)},
			nodes:  []string{"n1"},
		},
		"a slice managed by someone else is not ours": {
			slices: []discoveryv1.EndpointSlice{foreign},
			nodes:  []string{"n1"},
		},
		"no stale node withdraws nothing": {
			slices: []discoveryv1.EndpointSlice{slice("ns", "web", "uid-web", "n1", yes, yes)},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := make([]discoveryv1.EndpointSlice, len(tc.slices))
			for i := range tc.slices {
				before[i] = *tc.slices[i].DeepCopy()
			}
			judged := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
			got := Plan(tc.slices, owners, tc.nodes, judged)
			var names []string
			for _, s := range got {
				names = append(names, s.Name)
				assert.Equal(t, judged.Format(time.RFC3339Nano), s.Annotations[corev1.EndpointsLastChangeTriggerTime],
					"a withdrawal carries when the node was judged gone as its trigger time")
				for _, e := range s.Endpoints {
					assert.Equal(t, ptr.To(false), e.Conditions.Ready)
					assert.Equal(t, ptr.To(false), e.Conditions.Serving)
					assert.Equal(t, []string{"10.0.0.1"}, e.Addresses, "the endpoint is kept")
				}
			}
			assert.Equal(t, tc.want, names)
			assert.Equal(t, before, tc.slices, "the input is not modified")
		})
	}
}

// world is a resource with a ready slice on each of the nodes, and a tracker that saw the
// nodes' Leases once.
type world struct {
	ns      string
	client  client.Client // reads from a cache, as the controller's does
	clock   *clocktesting.FakeClock
	tracker *Tracker
	metrics *metrics.Liveness
	w       *Withdrawer
}

func newWorld(t *testing.T, nodes ...string) *world {
	t.Helper()
	ns := env.CreateNamespaceForTest(t, "withdraw")
	swh := &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []v1alpha1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	require.NoError(t, env.Client.Create(t.Context(), swh))
	for _, n := range nodes {
		s := slice(ns, "web", swh.UID, n, ptr.To(true), ptr.To(true))
		require.NoError(t, env.Client.Create(t.Context(), &s))
	}
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC))
	tr := NewTracker(clk, 40*time.Second)
	for _, n := range nodes {
		tr.Observe(n, time.Unix(1, 0))
	}
	m, err := metrics.NewLiveness(prometheus.NewRegistry())
	require.NoError(t, err)
	c := cachedClient(t)
	w := &world{ns: ns, clock: clk, tracker: tr, metrics: m, client: c,
		w: &Withdrawer{Client: c, Slices: slicewrite.New(c, nil, m), Tracker: tr, Metrics: m, Log: logr.Discard()}}
	w.caughtUp(t, nodes...)
	return w
}

// cachedClient is a client that reads, like the controller's, from an informer cache of our
// slices with the index by node (the withdrawer reads through it), and writes to the API server.
func cachedClient(t *testing.T) client.Client {
	t.Helper()
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, ByObject: map[client.Object]cache.ByObject{
		&discoveryv1.EndpointSlice{}: {Label: labels.SelectorFromSet(labels.Set{discoveryv1.LabelManagedBy: wellknown.ManagedBy})},
	}})
	require.NoError(t, err)
	require.NoError(t, index.Register(t.Context(), c))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert.NoError(t, c.Start(ctx))
	}()
	t.Cleanup(func() { cancel(); <-done })
	require.True(t, c.WaitForCacheSync(t.Context()), "the cache syncs")
	cl, err := client.New(env.Config, client.Options{Scheme: env.Scheme, Cache: &client.CacheOptions{Reader: c}})
	require.NoError(t, err)
	return cl
}

// caughtUp waits until the world's cache holds the slices of the nodes as the API server has
// them (a withdrawal decided on an older copy would conflict with the newer slice).
func (w *world) caughtUp(t *testing.T, nodes ...string) {
	t.Helper()
	for _, n := range nodes {
		w.sees(t, w.get(t, n))
	}
}

// sees waits until the world's cache holds s at its resourceVersion.
func (w *world) sees(t *testing.T, s *discoveryv1.EndpointSlice) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var cached discoveryv1.EndpointSlice
		if assert.NoError(c, w.client.Get(t.Context(), client.ObjectKeyFromObject(s), &cached)) {
			assert.Equal(c, s.ResourceVersion, cached.ResourceVersion)
		}
	}, 30*time.Second, 20*time.Millisecond, "the cache sees slice %s/%s", s.Namespace, s.Name)
}

// passGrace advances past the grace while the fresh nodes keep renewing.
func (w *world) passGrace(fresh ...string) {
	w.clock.Step(30 * time.Second)
	for _, n := range fresh {
		w.tracker.Observe(n, time.Unix(2, 0))
	}
	w.clock.Step(11 * time.Second)
}

func (w *world) get(t *testing.T, node string) *discoveryv1.EndpointSlice {
	t.Helper()
	var s discoveryv1.EndpointSlice
	key := client.ObjectKey{Namespace: w.ns, Name: slicemeta.SliceKey{Resource: "web", Port: "http", Node: node}.Name()}
	require.NoError(t, env.Client.Get(t.Context(), key, &s))
	return &s
}

func TestWithdrawerWithdrawsTheStaleNodeAndLeavesTheFreshOnes(t *testing.T) {
	w := newWorld(t, "wd-a1", "wd-a2", "wd-a3")
	freshBefore := w.get(t, "wd-a2").ResourceVersion
	w.passGrace("wd-a2", "wd-a3")

	v, err := w.w.Run(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []string{"wd-a1"}, v.Stale)
	assert.False(t, v.Guarded)

	stale := w.get(t, "wd-a1")
	require.Len(t, stale.Endpoints, 1, "the slice and its endpoint are kept for the returning agent")
	assert.Equal(t, ptr.To(false), stale.Endpoints[0].Conditions.Ready)
	assert.Equal(t, ptr.To(false), stale.Endpoints[0].Conditions.Serving)
	assert.Equal(t, freshBefore, w.get(t, "wd-a2").ResourceVersion, "a fresh node's slice is not written")
	assert.Equal(t, ptr.To(true), w.get(t, "wd-a3").Endpoints[0].Conditions.Ready)
	assert.InDelta(t, 1, testutil.ToFloat64(w.metrics.WithdrawnSlices), 0)
	assert.InDelta(t, 1, testutil.ToFloat64(w.metrics.WithdrawnEndpoints), 0)
	assert.InDelta(t, 1, testutil.ToFloat64(w.metrics.StaleAgents), 0)
	assert.InDelta(t, 0, testutil.ToFloat64(w.metrics.GuardHolding), 0)

	// A second round finds nothing left to write.
	withdrawnRV := stale.ResourceVersion
	w.caughtUp(t, "wd-a1")
	_, err = w.w.Run(t.Context())
	require.NoError(t, err)
	assert.Equal(t, withdrawnRV, w.get(t, "wd-a1").ResourceVersion, "an already withdrawn slice is not written again")
	assert.InDelta(t, 1, testutil.ToFloat64(w.metrics.WithdrawnSlices), 0)
}

func TestWithdrawerWithdrawsNothingWhileTheGuardHolds(t *testing.T) {
	w := newWorld(t, "wd-b1", "wd-b2", "wd-b3")
	before := map[string]string{}
	for _, n := range []string{"wd-b1", "wd-b2", "wd-b3"} {
		before[n] = w.get(t, n).ResourceVersion
	}
	w.passGrace("wd-b3")

	v, err := w.w.Run(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []string{"wd-b1", "wd-b2"}, v.Stale, "two of three agents are stale")
	assert.True(t, v.Guarded)
	assert.Contains(t, v.Reason, "2 of 3 agents")
	for n, rv := range before {
		assert.Equal(t, rv, w.get(t, n).ResourceVersion, "slice of %s untouched while the guard holds", n)
	}
	assert.InDelta(t, 1, testutil.ToFloat64(w.metrics.GuardHolding), 0)
	assert.InDelta(t, 2, testutil.ToFloat64(w.metrics.StaleAgents), 0)
	assert.InDelta(t, 0, testutil.ToFloat64(w.metrics.WithdrawnSlices), 0)
}

// TestWithdrawerFindsTheSlicesOfAStaleNodeInEveryNamespace: the slices of a stale node are
// found through the index by node in every namespace, each checked against its own live
// resource; a slice of a resource that no longer exists, and the slices of a fresh node, are
// left alone.
func TestWithdrawerFindsTheSlicesOfAStaleNodeInEveryNamespace(t *testing.T) {
	w := newWorld(t, "wd-d1", "wd-d2", "wd-d3")
	ns2 := env.CreateNamespaceForTest(t, "withdraw2")
	api := &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns2, Name: "api"},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Selector: map[string]string{"app": "api"},
			Ports:    []v1alpha1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	require.NoError(t, env.Client.Create(t.Context(), api))
	made := map[string]*discoveryv1.EndpointSlice{}
	for name, s := range map[string]discoveryv1.EndpointSlice{
		"api on the stale node":      slice(ns2, "api", api.UID, "wd-d1", ptr.To(true), ptr.To(true)),
		"api on a fresh node":        slice(ns2, "api", api.UID, "wd-d2", ptr.To(true), ptr.To(true)),
		"a deleted resource's slice": slice(ns2, "gone", "uid-gone", "wd-d1", ptr.To(true), ptr.To(true)),
	} {
		require.NoError(t, env.Client.Create(t.Context(), &s))
		w.sees(t, &s)
		made[name] = &s
	}
	w.passGrace("wd-d2", "wd-d3")

	v, err := w.w.Run(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []string{"wd-d1"}, v.Stale)
	read := func(s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
		var got discoveryv1.EndpointSlice
		require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(s), &got))
		return &got
	}
	assert.Equal(t, ptr.To(false), w.get(t, "wd-d1").Endpoints[0].Conditions.Ready, "the stale node's slice in the first namespace is withdrawn")
	assert.Equal(t, ptr.To(false), read(made["api on the stale node"]).Endpoints[0].Conditions.Ready, "and the one in the second namespace")
	for _, name := range []string{"api on a fresh node", "a deleted resource's slice"} {
		assert.Equal(t, made[name].ResourceVersion, read(made[name]).ResourceVersion, "%s is not written", name)
	}
	assert.InDelta(t, 2, testutil.ToFloat64(w.metrics.WithdrawnSlices), 0)
}

func TestWithdrawerLeavesEverythingWhileNoAgentIsStale(t *testing.T) {
	w := newWorld(t, "wd-c1", "wd-c2")
	rv := w.get(t, "wd-c1").ResourceVersion
	w.clock.Step(40 * time.Second)

	v, err := w.w.Run(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 2, v.Known)
	assert.Empty(t, v.Stale, "exactly the grace is not stale")
	assert.Equal(t, rv, w.get(t, "wd-c1").ResourceVersion)
}
