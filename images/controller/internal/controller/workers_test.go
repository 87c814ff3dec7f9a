// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/childservice"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/gc"
)

// onePort is a resource with a single port of the given name.
func onePort(ns, name, port string) *v1alpha1.ServiceWithHealthchecks {
	return newResource(ns, name, func(s *v1alpha1.ServiceWithHealthchecks) {
		s.Spec.Ports = s.Spec.Ports[:1]
		s.Spec.Ports[0].Name = port
	})
}

// createAll creates the objects concurrently, as many clients at once would.
func createAll(t *testing.T, objs ...client.Object) {
	t.Helper()
	var wg sync.WaitGroup
	for _, o := range objs {
		wg.Go(func() { assert.NoError(t, env.Client.Create(t.Context(), o), "creating %s", o.GetName()) })
	}
	wg.Wait()
	require.False(t, t.Failed(), "every object was created")
}

func conflictIs(status metav1.ConditionStatus, contains []string, lacks ...string) func(*assert.CollectT, *v1alpha1.ServiceWithHealthchecks) {
	return func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		cond := condition(swh, v1alpha1.ConditionSliceNameConflict)
		assert.Equal(c, status, cond.Status, "SliceNameConflict of %s: %s", swh.Name, cond.Message)
		assert.Equal(c, swh.Generation, cond.ObservedGeneration)
		for _, s := range contains {
			assert.Contains(c, cond.Message, s)
		}
		for _, s := range lacks {
			assert.NotContains(c, cond.Message, s)
		}
	}
}

// TestSeveralWorkersKeepCollisionsAdoptionsAndGarbageRight runs the controller with four
// reconcile workers against a burst of resources created at once: pairs and triples whose slice
// names collide, resources adopting Services (with built-in slices to delete), and resources
// with garbage slices on a node that does not exist. Run it with -race
// (development/CONTROLLER.md, "Reconcile workers"): the workers share the caches, the metrics
// and the record of swept Services. Every resource ends where one worker would have left it:
// each collision reported on every side and naming exactly its partners, each Service adopted
// once with its selector cleared and its built-in slice deleted, each garbage slice collected
// and no other; and the collisions follow deletions and a port change.
func TestSeveralWorkersKeepCollisionsAdoptionsAndGarbageRight(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "workers")
	var inFlight, most atomic.Int32
	run := startController(t, ns, func(o *Options) {
		o.MaxConcurrentReconciles = 4
		o.onReconcile = func() func() {
			n := inFlight.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			return func() { inFlight.Add(-1) }
		}
	})
	if !raceDetector {
		t.Log("run with -race to check the workers for data races")
	}
	const pairs, triples, adopters, solos = 4, 2, 4, 4
	live := node(t, ns+"-n1")

	var objs []client.Object
	for i := range pairs {
		// p<i> port x-y and p<i>-x port y: the prefix p<i>-x-y- on every node.
		objs = append(objs, onePort(ns, fmt.Sprintf("p%d", i), "x-y"), onePort(ns, fmt.Sprintf("p%d-x", i), "y"))
	}
	for i := range triples {
		// t<i> port a-b-c, t<i>-a port b-c, t<i>-a-b port c: three of a kind.
		objs = append(objs, onePort(ns, fmt.Sprintf("t%d", i), "a-b-c"), onePort(ns, fmt.Sprintf("t%d-a", i), "b-c"),
			onePort(ns, fmt.Sprintf("t%d-a-b", i), "c"))
	}
	services := make([]*corev1.Service, adopters)
	for i := range adopters {
		svc := liveService(ns)
		svc.Name = fmt.Sprintf("adopt%d", i)
		svc.Spec.Selector = map[string]string{"app": svc.Name} // selects no pod: cleared at once
		svc.Spec.Ports[1].TargetPort = intstr.FromInt32(9090)
		services[i] = svc
	}
	for _, svc := range services {
		create(t, svc)
	}
	builtins := make([]*discoveryv1.EndpointSlice, adopters)
	for i, svc := range services {
		builtins[i] = builtinSlice(t, svc, svc.Name+"-builtin", nil)
	}
	adopting := make([]*v1alpha1.ServiceWithHealthchecks, adopters)
	for i := range adopters {
		adopting[i] = newResource(ns, fmt.Sprintf("adopt%d", i), func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Type = corev1.ServiceTypeNodePort })
		objs = append(objs, adopting[i])
	}
	soloRes := make([]*v1alpha1.ServiceWithHealthchecks, solos)
	for i := range solos {
		soloRes[i] = onePort(ns, fmt.Sprintf("solo%d", i), "http")
		objs = append(objs, soloRes[i])
	}
	createAll(t, objs...)

	// Slices of the solo resources: one on a live node (kept), one on a node that does not
	// exist (garbage).
	kept := make([]*discoveryv1.EndpointSlice, solos)
	garbage := make([]*discoveryv1.EndpointSlice, solos)
	for i, swh := range soloRes {
		kept[i] = slice(t, ns, swh.Name, swh.UID, "http", live.Name)
		garbage[i] = slice(t, ns, swh.Name, swh.UID, "http", ns+"-gone")
	}

	for i := range pairs {
		a, b := fmt.Sprintf("p%d", i), fmt.Sprintf("p%d-x", i)
		eventually(t, onePort(ns, a, ""), conflictIs(metav1.ConditionTrue, []string{"port x-y collides with resource " + b + ", port y"}),
			a+" reports its collision with "+b)
		eventually(t, onePort(ns, b, ""), conflictIs(metav1.ConditionTrue, []string{"port y collides with resource " + a + ", port x-y"}),
			b+" reports its collision with "+a)
	}
	for i := range triples {
		a, b, c := fmt.Sprintf("t%d", i), fmt.Sprintf("t%d-a", i), fmt.Sprintf("t%d-a-b", i)
		eventually(t, onePort(ns, a, ""), conflictIs(metav1.ConditionTrue, []string{
			"port a-b-c collides with resource " + b + ", port b-c; port a-b-c collides with resource " + c + ", port c",
		}), a+" names both partners")
		eventually(t, onePort(ns, b, ""), conflictIs(metav1.ConditionTrue, []string{"resource " + a + ", port a-b-c", "resource " + c + ", port c"}),
			b+" names both partners")
		eventually(t, onePort(ns, c, ""), conflictIs(metav1.ConditionTrue, []string{"resource " + a + ", port a-b-c", "resource " + b + ", port b-c"}),
			c+" names both partners")
	}
	for _, swh := range soloRes {
		eventually(t, swh, conflictIs(metav1.ConditionFalse, nil), swh.Name+" collides with nothing")
	}
	for i, svc := range services {
		eventually(t, service(ns, svc.Name), func(c *assert.CollectT, got *corev1.Service) {
			if assert.Len(c, got.OwnerReferences, 1) {
				assert.Equal(c, adopting[i].UID, got.OwnerReferences[0].UID)
			}
			assert.Empty(c, got.Spec.Selector)
			assert.Equal(c, svc.Spec.ClusterIP, got.Spec.ClusterIP, "the cluster IP is kept")
		}, svc.Name+" is adopted and its selector cleared")
		gone(t, builtins[i], "the built-in slice of "+svc.Name+" is deleted")
		eventually(t, adopting[i], func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
			cond := condition(swh, v1alpha1.ConditionServiceSynced)
			assert.Equal(c, childservice.ReasonSynced, cond.Reason)
			assert.Equal(c, svc.Spec.ClusterIP, swh.Status.ClusterIP)
		}, adopting[i].Name+" is in sync")
	}
	for i := range solos {
		gone(t, garbage[i], "the slice on the missing node is collected")
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, float64(adopters), testutil.ToFloat64(run.metrics.Adoptions))
		assert.Equal(c, float64(adopters), testutil.ToFloat64(run.metrics.BuiltinSlicesDeleted))
		assert.Equal(c, float64(solos), testutil.ToFloat64(run.metrics.GarbageCollectedSlices.WithLabelValues(string(gc.NodeDeleted))))
	}, wait, tick, "every adoption, built-in deletion and collection is counted once")
	t.Logf("at most %d reconciles ran at once", most.Load())
	assert.GreaterOrEqual(t, most.Load(), int32(2), "reconciles ran at once")

	// Deleting one side of each pair but the first, and changing the first's port, ends those
	// collisions on the other side; deleting the middle of each triple leaves the outer two
	// colliding with each other only.
	var deletes []client.Object
	for i := 1; i < pairs; i++ {
		deletes = append(deletes, onePort(ns, fmt.Sprintf("p%d-x", i), ""))
	}
	for i := range triples {
		deletes = append(deletes, onePort(ns, fmt.Sprintf("t%d-a", i), ""))
	}
	var wg sync.WaitGroup
	for _, o := range deletes {
		wg.Go(func() { assert.NoError(t, env.Client.Delete(t.Context(), o), "deleting %s", o.GetName()) })
	}
	wg.Go(func() {
		update(t, onePort(ns, "p0-x", ""), func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Ports[0].Name = "z" })
	})
	wg.Wait()
	for i := range pairs {
		eventually(t, onePort(ns, fmt.Sprintf("p%d", i), ""), conflictIs(metav1.ConditionFalse, nil),
			fmt.Sprintf("p%d no longer collides", i))
	}
	eventually(t, onePort(ns, "p0-x", ""), conflictIs(metav1.ConditionFalse, nil), "p0-x with its new port collides with nothing")
	for i := range triples {
		a, c := fmt.Sprintf("t%d", i), fmt.Sprintf("t%d-a-b", i)
		eventually(t, onePort(ns, a, ""), conflictIs(metav1.ConditionTrue, []string{"resource " + c + ", port c"}, "resource "+a+"-a, port"),
			a+" still collides with "+c+" only")
		eventually(t, onePort(ns, c, ""), conflictIs(metav1.ConditionTrue, []string{"resource " + a + ", port a-b-c"}, "resource "+a+"-a, port"),
			c+" still collides with "+a+" only")
	}
	for i := range solos {
		assert.True(t, exists(t, kept[i]), "the slice on the live node stays")
	}
	for i := range adopters {
		assert.Len(t, eventsAbout(t, ns, services[i].Name, eventAdopted), 1, "%s is adopted once", services[i].Name)
		assert.Len(t, eventsAbout(t, ns, services[i].Name, eventSelectorCleared), 1, "the selector of %s is cleared once", services[i].Name)
	}
	assert.Equal(t, float64(adopters), testutil.ToFloat64(run.metrics.Adoptions), "no adoption is repeated")
	assert.Equal(t, float64(solos), testutil.ToFloat64(run.metrics.GarbageCollectedSlices.WithLabelValues(string(gc.NodeDeleted))),
		"nothing else is collected")
}
