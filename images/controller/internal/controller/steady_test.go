// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// TestNoWritesInASteadyState forces reconciles of an unchanged resource and proves that neither
// the Service nor the resource is written: a watch opened before sees no event but the one the
// test itself makes at the end, while the reconcile counter rose.
func TestNoWritesInASteadyState(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "steady")
	run := startController(t, ns, nil)

	// Many fields the API server defaults or allocates, which a careless diff would fight.
	swh := newResource(ns, "web", func(s *v1alpha1.ServiceWithHealthchecks) {
		s.Labels = map[string]string{"team": "web"}
		s.Annotations = map[string]string{"example.org/note": "x"}
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.ExternalIPs = []string{"198.51.100.7"}
		s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24"}
		s.Spec.PublishNotReadyAddresses = true
		s.Spec.TrafficDistribution = ptr.To("PreferClose")
	})
	create(t, swh)
	nodeName := ns + "-n1"
	node(t, nodeName)
	sl := slice(t, ns, "web", swh.UID, "http", nodeName)

	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.Equal(c, metav1.ConditionTrue, condition(swh, v1alpha1.ConditionServiceSynced).Status)
		assert.NotEmpty(c, swh.Status.ClusterIP)
	}, "the resource is in sync")

	// Let the creation settle: writes stop once the controller has seen its own writes.
	svc := service(ns, "web")
	settled := false
	for deadline := time.Now().Add(wait); !settled && time.Now().Before(deadline); {
		writes, statusWrites, reconciles := run.serviceWrites(), testutil.ToFloat64(run.metrics.StatusWrites), run.reconciles()
		touch(t, sl, "settle")
		require.Eventually(t, func() bool { return run.reconciles() > reconciles }, wait, tick)
		settled = writes == run.serviceWrites() && statusWrites == testutil.ToFloat64(run.metrics.StatusWrites)
	}
	require.True(t, settled, "the controller stops writing after the creation")

	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(svc), svc))
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(swh), swh))
	svcWatch := watchFrom(t, &corev1.ServiceList{}, ns, "web", svc.ResourceVersion)
	swhWatch := watchFrom(t, &v1alpha1.ServiceWithHealthchecksList{}, ns, "web", swh.ResourceVersion)
	writes, statusWrites := run.serviceWrites(), testutil.ToFloat64(run.metrics.StatusWrites)

	for i := range 3 {
		before := run.reconciles()
		touch(t, sl, fmt.Sprint(i))
		require.Eventually(t, func() bool { return run.reconciles() > before }, wait, tick, "touch %d is reconciled", i)
	}

	assert.Equal(t, writes, run.serviceWrites(), "no Service write in a steady state")
	assert.Equal(t, statusWrites, testutil.ToFloat64(run.metrics.StatusWrites), "no status write in a steady state")

	// A write of the test's own closes both watches: every event before it has arrived by then.
	svc.Annotations["example.org/barrier"] = "1"
	require.NoError(t, env.Client.Update(t.Context(), svc))
	swh.Annotations["example.org/barrier"] = "1"
	require.NoError(t, env.Client.Update(t.Context(), swh))
	assertOnlyEventIsTheBarrier(t, svcWatch)
	assertOnlyEventIsTheBarrier(t, swhWatch)
}

// touch changes an unrelated annotation of a slice; the controller reconciles its resource.
func touch(t *testing.T, s *discoveryv1.EndpointSlice, value string) {
	t.Helper()
	patch := client.MergeFrom(s.DeepCopy())
	s.Annotations["example.org/touch"] = value
	require.NoError(t, env.Client.Patch(t.Context(), s, patch))
}

func watchFrom(t *testing.T, list client.ObjectList, ns, name, rv string) watch.Interface {
	t.Helper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	w, err := wc.Watch(t.Context(), list, client.InNamespace(ns),
		&client.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name), Raw: &metav1.ListOptions{ResourceVersion: rv}})
	require.NoError(t, err)
	t.Cleanup(w.Stop)
	return w
}

func assertOnlyEventIsTheBarrier(t *testing.T, w watch.Interface) {
	t.Helper()
	for {
		select {
		case ev := <-w.ResultChan():
			obj, ok := ev.Object.(client.Object)
			require.True(t, ok, "unexpected watch event %v", ev)
			require.Equal(t, "1", obj.GetAnnotations()["example.org/barrier"],
				"%s was written in a steady state (event %s, resourceVersion %s)", obj.GetName(), ev.Type, obj.GetResourceVersion())
			return
		case <-time.After(wait):
			t.Fatal("the barrier event never arrived")
		}
	}
}
