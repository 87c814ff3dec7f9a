// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/gc"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/slicewrite"
)

func TestGarbageSlicesAreDeletedAndTheRestSurvives(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "gc")
	run := startController(t, ns, nil)

	swh := newResource(ns, "web", nil)
	create(t, swh)
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.NotEmpty(c, swh.Status.Conditions)
	}, "the resource is reconciled")

	live, doomed := ns+"-live", ns+"-doomed"
	node(t, live)
	doomedNode := node(t, doomed)
	never := ns + "-never"

	// Survivors: ours for a live node and port, and slices of other managers whatever they say.
	keepHTTP := slice(t, ns, "web", swh.UID, "http", live)
	keepMetrics := slice(t, ns, "web", swh.UID, "metrics", live)
	keepOtherManager := slice(t, ns, "web", swh.UID, "http", never, named("web-http-builtin"), managedBy("endpointslice-controller.k8s.io"))
	keepOtherManagerGone := slice(t, ns, "ghost", "ghost-uid", "http", never, named("ghost-builtin"), managedBy("someone-else"))

	// Garbage of every kind.
	garbage := map[gc.Reason][]*discoveryv1.EndpointSlice{
		gc.NodeDeleted:     {slice(t, ns, "web", swh.UID, "http", never), slice(t, ns, "web", swh.UID, "metrics", doomed)},
		gc.PortRemoved:     {slice(t, ns, "web", swh.UID, "old", live)},
		gc.OwnerMismatch:   {slice(t, ns, "web", "uid-of-a-deleted-web", "http", live, named("web-http-"+live+"-stale"))},
		gc.ResourceDeleted: {slice(t, ns, "ghost", "ghost-uid", "http", live)},
	}

	for reason, slices := range garbage {
		for _, s := range slices {
			if s.Name == "web-metrics-"+doomed {
				continue // its node still exists
			}
			gone(t, s, string(reason)+": "+s.Name+" is deleted")
		}
	}

	t.Run("a slice is deleted when its node is deleted", func(t *testing.T) {
		s := garbage[gc.NodeDeleted][1]
		require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(s), s), "the slice lives while its node does")
		require.NoError(t, env.Client.Delete(t.Context(), doomedNode))
		gone(t, s, "the slice of the deleted node is deleted")
	})

	t.Run("a slice is deleted when its port is removed from the resource", func(t *testing.T) {
		update(t, swh, func(swh *v1alpha1.ServiceWithHealthchecks) { swh.Spec.Ports = swh.Spec.Ports[:1] })
		gone(t, keepMetrics, "the slice of the removed port is deleted")
	})

	t.Run("live slices and other managers' slices survive", func(t *testing.T) {
		for _, s := range []*discoveryv1.EndpointSlice{keepHTTP, keepOtherManager, keepOtherManagerGone} {
			assert.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(s), s), "%s survives", s.Name)
		}
	})

	// Each deletion is counted after its DELETE returns, so the last count may trail the slice's
	// disappearance by a moment.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, 2.0, testutil.ToFloat64(run.metrics.GarbageCollectedSlices.WithLabelValues(string(gc.NodeDeleted))))
		assert.Equal(c, 2.0, testutil.ToFloat64(run.metrics.GarbageCollectedSlices.WithLabelValues(string(gc.PortRemoved))))
		assert.Equal(c, 1.0, testutil.ToFloat64(run.metrics.GarbageCollectedSlices.WithLabelValues(string(gc.OwnerMismatch))))
		assert.Equal(c, 1.0, testutil.ToFloat64(run.metrics.GarbageCollectedSlices.WithLabelValues(string(gc.ResourceDeleted))))
	}, wait, tick, "every collected slice is counted by its reason")

	t.Run("deleting the resource deletes its slices", func(t *testing.T) {
		require.NoError(t, env.Client.Delete(t.Context(), swh))
		gone(t, keepHTTP, "the slice of the deleted resource is deleted")
		gone(t, &corev1.Service{ObjectMeta: swh.ObjectMeta}, "and so is its Service")
		assert.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(keepOtherManager), keepOtherManager),
			"another manager's slice with the deleted resource's name survives")
	})
}

// TestACollectionDecidedBeforeAnAdoptionDeletesNothing makes the race of issue 17 part 4
// deterministic: a slice is left by a deleted incarnation of "web" (owner: the old UID) and the
// resource is created again; the collector decides from a snapshot that the slice is garbage
// (OwnerMismatch); then the agent adopts it through the API (owner: the new UID, as
// images/agent/internal/sliceplan.Merge writes it), and only then the collector confirms and
// deletes. The delete carries the snapshot's UID and resourceVersion, so it conflicts and the
// adopted slice stays, published. Without the adoption the same decision deletes the slice:
// the delete did run.
func TestACollectionDecidedBeforeAnAdoptionDeletesNothing(t *testing.T) {
	tests := map[string]struct {
		adopt     bool
		wantKept  bool
		wantCount float64
	}{
		"a slice the agent adopted between the decision and the delete stays": {adopt: true, wantKept: true},
		"without an adoption the same decision deletes the slice":             {adopt: false, wantCount: 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			ns := env.CreateNamespaceForTest(t, "adoption")
			m, err := metrics.New(prometheus.NewRegistry())
			require.NoError(t, err)
			cs, err := kubernetes.NewForConfig(env.Config)
			require.NoError(t, err)
			// The reconciler's collector alone, on the API server (no informer, no queue): every step
			// happens when the test says.
			r := &Reconciler{client: env.Client, reader: env.Client, services: cs, sliceWriter: slicewrite.New(env.Client, m, nil), metrics: m, now: time.Now}

			nodeName := ns + "-n1"
			node(t, nodeName)
			old := newResource(ns, "web", nil)
			create(t, old)
			left := slice(t, ns, "web", old.UID, "http", nodeName)
			require.NoError(t, env.Client.Delete(ctx, old))
			gone(t, old, "the first incarnation is gone")
			swh := newResource(ns, "web", nil)
			create(t, swh)
			require.NotEqual(t, old.UID, swh.UID)

			var snapshot discoveryv1.EndpointSlice
			require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(left), &snapshot))
			candidates := gc.Decide(gc.Input{Resource: swh, Nodes: sets.New(nodeName), Slices: []discoveryv1.EndpointSlice{snapshot}})
			require.Len(t, candidates, 1, "the snapshot's slice is garbage")
			require.Equal(t, gc.OwnerMismatch, candidates[0].Reason)

			if tc.adopt {
				adopted := snapshot.DeepCopy()
				adopted.OwnerReferences = []metav1.OwnerReference{slicemeta.OwnerReference("web", swh.UID)}
				require.NoError(t, env.Client.Update(ctx, adopted), "the agent takes the slice over")
			}
			require.NoError(t, r.confirmAndDelete(ctx, client.ObjectKeyFromObject(swh), candidates))

			var after discoveryv1.EndpointSlice
			err = env.Client.Get(ctx, client.ObjectKeyFromObject(left), &after)
			if tc.wantKept {
				require.NoError(t, err, "the adopted slice is still there")
				assert.Equal(t, swh.UID, slicemeta.OwnerUID(&after), "owned by the live resource")
				require.Len(t, after.Endpoints, 1)
				assert.True(t, ptr.Deref(after.Endpoints[0].Conditions.Ready, false), "and still published ready")
			} else {
				assert.True(t, apierrors.IsNotFound(err), "the garbage is deleted, got %v", err)
			}
			assert.Equal(t, tc.wantCount, testutil.ToFloat64(m.GarbageCollectedSlices.WithLabelValues(string(gc.OwnerMismatch))))
		})
	}
}
