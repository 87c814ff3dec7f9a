// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/publisher"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/sliceplan"
)

// An update computed from a stale version is retried on the latest one, keeping what others
// added; when the latest version is no longer ours, nothing is written.
func TestAConflictingUpdateIsRetriedOnTheLatestVersion(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "conflict")
	swh := createResource(t, c, ns, "web", nil, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-0", UID: "uid-web-0"},
		Spec:       corev1.PodSpec{NodeName: "node-a"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "198.18.251.1", PodIPs: []corev1.PodIP{{IP: "198.18.251.1"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	desired := func(ready bool) []sliceplan.Desired {
		p := pod.DeepCopy()
		if !ready {
			p.Status.Conditions[0].Status = corev1.ConditionFalse
		}
		return sliceplan.Compute(sliceplan.Input{Resource: swh, Node: "node-a",
			Pods: []sliceplan.Pod{{Pod: p, Endpoints: portrule.Evaluate(&swh.Spec, p, nil)}}})
	}
	m := metrics.New(nil)
	pub := &publisher.Publisher{Client: c.Env.Client, Reader: c.Env.Client, Metrics: m}

	first := desired(true)
	_, err := pub.Apply(t.Context(), sliceplan.Diff("web", swh.UID, "node-a", first, nil))
	require.NoError(t, err)
	stale := &discoveryv1.EndpointSlice{}
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "web-http-node-a"}, stale))

	// Someone else labels the slice: our copy is now stale.
	other := stale.DeepCopy()
	other.Labels["team"] = "web"
	require.NoError(t, c.Env.Client.Update(t.Context(), other))

	next := desired(false)
	plan := sliceplan.Diff("web", swh.UID, "node-a", next, map[string]*discoveryv1.EndpointSlice{stale.Name: stale})
	require.Len(t, plan.Update, 1)
	_, err = pub.Apply(t.Context(), plan)
	require.NoError(t, err)
	got := &discoveryv1.EndpointSlice{}
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(stale), got))
	assert.False(t, *got.Endpoints[0].Conditions.Ready, "the new content was written")
	assert.Equal(t, "web", got.Labels["team"], "what the other writer added is kept")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.SliceWriteErrors.WithLabelValues(metrics.OpUpdate)), "the first attempt conflicted")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.SliceWrites.WithLabelValues(metrics.OpUpdate)))

	// The slice is taken over by another resource's labels meanwhile: the retry refuses.
	stale = got.DeepCopy()
	taken := got.DeepCopy()
	taken.Labels[slicemeta.LabelResource] = "someone-else"
	require.NoError(t, c.Env.Client.Update(t.Context(), taken))
	again := desired(true)
	plan = sliceplan.Diff("web", swh.UID, "node-a", again, map[string]*discoveryv1.EndpointSlice{stale.Name: stale})
	require.Len(t, plan.Update, 1)
	_, err = pub.Apply(t.Context(), plan)
	require.ErrorContains(t, err, "no longer ours")
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(stale), got))
	assert.Equal(t, taken.ResourceVersion, got.ResourceVersion, "nothing was written to a slice that is not ours")
}
