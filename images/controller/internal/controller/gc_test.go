package controller

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/gc"
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
