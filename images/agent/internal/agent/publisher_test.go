// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	discoveryv1ac "k8s.io/client-go/applyconfigurations/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/publisher"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/sliceplan"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// An update computed from a stale version is retried on the latest one, keeping what others
// added; when the latest version is no longer ours, nothing is written.
func TestAConflictingUpdateIsRetriedOnTheLatestVersion(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "conflict")
	swh, desired := onePodResource(t, c, ns, "198.18.251.1")
	pub, m := testPublisher(c)

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
	taken.Labels[wellknown.LabelResource] = "someone-else"
	require.NoError(t, c.Env.Client.Update(t.Context(), taken))
	again := desired(true)
	plan = sliceplan.Diff("web", swh.UID, "node-a", again, map[string]*discoveryv1.EndpointSlice{stale.Name: stale})
	require.Len(t, plan.Update, 1)
	_, err = pub.Apply(t.Context(), plan)
	require.ErrorContains(t, err, "no longer ours")
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(stale), got))
	assert.Equal(t, taken.ResourceVersion, got.ResourceVersion, "nothing was written to a slice that is not ours")
}

// A plan that renames a slice (here an IPv6 slice of the old name, as an upgraded agent finds
// it) creates the new one and deletes the old one. When the create fails, the delete waits for
// the retry: the old slice keeps the endpoints in the Service meanwhile. The failure is real: a
// ResourceQuota on EndpointSlices whose status says it is used up makes the API server refuse
// every create of a slice in the namespace, and nothing else (envtest runs no quota controller
// to recount it).
func TestARenamedSliceIsDeletedOnlyOnceItsSuccessorIsCreated(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "rename")
	policy := corev1.IPFamilyPolicyRequireDualStack
	swh := createResource(t, c, ns, "web", nil, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))})
	swh.Spec.IPFamilyPolicy = &policy
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-0", UID: "uid-web-0"},
		Spec:       corev1.PodSpec{NodeName: "node-a"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "2001:2:1:ffff::1", PodIPs: []corev1.PodIP{{IP: "2001:2:1:ffff::1"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	desired := sliceplan.Compute(sliceplan.Input{Resource: swh, Node: "node-a",
		Pods: []sliceplan.Pod{{Pod: pod, Endpoints: portrule.Evaluate(&swh.Spec, pod, nil)}}})
	require.Len(t, desired, 1)
	require.Equal(t, "web-http--node-a-ipv6", desired[0].Slice.Name)
	old := desired[0].Slice.DeepCopy()
	old.Name = desired[0].Key.LegacyName()
	require.NoError(t, c.Env.Client.Create(t.Context(), old))
	plan := sliceplan.Diff("web", swh.UID, "node-a", desired, map[string]*discoveryv1.EndpointSlice{old.Name: old})
	require.Len(t, plan.Create, 1)
	require.Len(t, plan.Delete, 1)

	quota := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "no-new-slices"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"count/endpointslices.discovery.k8s.io": resource.MustParse("100")}},
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), quota))
	// Standing in for the quota controller: the namespace has used up its slices.
	quota.Status = corev1.ResourceQuotaStatus{Hard: quota.Spec.Hard, Used: quota.Spec.Hard}
	require.NoError(t, c.Env.Client.Status().Update(t.Context(), quota))
	require.Eventually(t, func() bool {
		probe := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "quota-probe"}, AddressType: discoveryv1.AddressTypeIPv4}
		return apierrors.IsForbidden(c.Env.Client.Create(t.Context(), probe, client.DryRunAll))
	}, 30*time.Second, 50*time.Millisecond, "the quota refuses new slices")
	pub, m := testPublisher(c)
	_, err := pub.Apply(t.Context(), plan)
	require.ErrorContains(t, err, "creating EndpointSlice web-http--node-a-ipv6")
	require.ErrorContains(t, err, "waits for the retry")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.SliceWriteErrors.WithLabelValues(metrics.OpCreate)), "the create was refused")
	assert.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(old), &discoveryv1.EndpointSlice{}), "the old slice is kept")
	assert.Zero(t, testutil.ToFloat64(m.SliceWrites.WithLabelValues(metrics.OpDelete)))

	// The retry (the same plan: the cache would not have changed) once creates are allowed again.
	require.NoError(t, c.Env.Client.Delete(t.Context(), quota))
	require.Eventually(t, func() bool {
		_, _ = pub.Apply(t.Context(), plan)
		created := c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "web-http--node-a-ipv6"}, &discoveryv1.EndpointSlice{})
		gone := c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(old), &discoveryv1.EndpointSlice{})
		return created == nil && apierrors.IsNotFound(gone)
	}, 30*time.Second, 100*time.Millisecond, "the retry creates the new slice and deletes the old one")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.SliceWrites.WithLabelValues(metrics.OpCreate)))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.SliceWrites.WithLabelValues(metrics.OpDelete)))
}

// Every update strips the slice's managedFields, so the API server tracks no fields of the
// module's slices after their create: the updates that follow (the agent's, the controller's
// withdrawals, anyone's plain update) skip the structured-merge work over every endpoint. A field
// someone else applies is kept; its record goes with the next update.
func TestAnUpdatedSliceCarriesNoManagedFields(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "managedfields")
	swh, desired := onePodResource(t, c, ns, "198.18.251.2")
	pub, _ := testPublisher(c)
	key := client.ObjectKey{Namespace: ns, Name: "web-http-node-a"}
	publish := func(ready bool) *discoveryv1.EndpointSlice {
		t.Helper()
		cur := &discoveryv1.EndpointSlice{}
		existing := map[string]*discoveryv1.EndpointSlice{}
		if err := c.Env.Client.Get(t.Context(), key, cur); err == nil {
			existing[cur.Name] = cur
		}
		_, err := pub.Apply(t.Context(), sliceplan.Diff("web", swh.UID, "node-a", desired(ready), existing))
		require.NoError(t, err)
		got := &discoveryv1.EndpointSlice{}
		require.NoError(t, c.Env.Client.Get(t.Context(), key, got))
		require.Len(t, got.Endpoints, 1)
		assert.Equal(t, ready, *got.Endpoints[0].Conditions.Ready, "the content was written")
		return got
	}

	created := publish(true)
	require.NotEmpty(t, created.ManagedFields, "a create is always tracked")
	updated := publish(false)
	assert.Empty(t, updated.ManagedFields, "the update removed the managedFields")
	assert.NotEqual(t, created.ResourceVersion, updated.ResourceVersion)

	// Someone applies a label: the API server records that manager again; the agent's next
	// update keeps the label and strips the record.
	apply := discoveryv1ac.EndpointSlice(key.Name, ns).WithLabels(map[string]string{"team": "web"}).
		WithAddressType(discoveryv1.AddressTypeIPv4)
	require.NoError(t, c.Env.Client.Apply(t.Context(), apply, client.FieldOwner("someone"), client.ForceOwnership))
	applied := &discoveryv1.EndpointSlice{}
	require.NoError(t, c.Env.Client.Get(t.Context(), key, applied))
	require.NotEmpty(t, applied.ManagedFields, "an apply is tracked")
	again := publish(true)
	assert.Empty(t, again.ManagedFields, "the next update removed them again")
	assert.Equal(t, "web", again.Labels["team"], "what the other writer applied is kept")
}

// onePodResource creates a resource "web" with one named port and returns it with the desired
// slices of its one pod web-0 on node-a (an object only: nothing dials ip), ready or not.
// testPublisher is a publisher writing straight to the test cluster, with metrics of its own.
func testPublisher(c *cluster.Cluster) (*publisher.Publisher, *metrics.Metrics) {
	m := metrics.New(nil)
	return &publisher.Publisher{Client: c.Env.Client, Reader: c.Env.Client, Metrics: m}, m
}

func onePodResource(t *testing.T, c *cluster.Cluster, ns, ip string) (*v1alpha1.ServiceWithHealthchecks, func(ready bool) []sliceplan.Desired) {
	t.Helper()
	swh := createResource(t, c, ns, "web", nil, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-0", UID: "uid-web-0"},
		Spec:       corev1.PodSpec{NodeName: "node-a"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	return swh, func(ready bool) []sliceplan.Desired {
		p := pod.DeepCopy()
		if !ready {
			p.Status.Conditions[0].Status = corev1.ConditionFalse
		}
		return sliceplan.Compute(sliceplan.Input{Resource: swh, Node: "node-a",
			Pods: []sliceplan.Pod{{Pod: p, Endpoints: portrule.Evaluate(&swh.Spec, p, nil)}}})
	}
}

// A merge of chunks (sliceplan: a split port shrunk to half the size) moves an endpoint from a
// further chunk into the first: when the update of the first is refused, the chunk is not
// deleted, so the endpoint stays in a slice until the retry writes the first and then deletes
// the chunk. The API server refuses the update through a ValidatingAdmissionPolicy of this
// test's namespace (refuseSliceUpdates).
func TestAMergedChunkIsDeletedOnlyOnceTheSliceReceivingItsEndpointsIsWritten(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "merge")
	swh := createResource(t, c, ns, "web", nil, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))})
	var pods []sliceplan.Pod
	for i := range 6 {
		ip := fmt.Sprintf("198.18.252.%d", i+1)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("web-%d", i), UID: types.UID(fmt.Sprintf("uid-web-%d", i))},
			Spec:       corev1.PodSpec{NodeName: "node-a"},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}
		pods = append(pods, sliceplan.Pod{Pod: pod, Endpoints: portrule.Evaluate(&swh.Spec, pod, nil)})
	}
	pub, m := testPublisher(c)
	existing := func() map[string]*discoveryv1.EndpointSlice {
		list := &discoveryv1.EndpointSliceList{}
		require.NoError(t, c.Env.Client.List(t.Context(), list, client.InNamespace(ns)))
		out := map[string]*discoveryv1.EndpointSlice{}
		for i := range list.Items {
			out[list.Items[i].Name] = &list.Items[i]
		}
		return out
	}
	plan := func(pods ...sliceplan.Pod) sliceplan.Plan {
		cur := existing()
		desired := sliceplan.Compute(sliceplan.Input{Resource: swh, Node: "node-a", Pods: pods, Existing: slices.Collect(maps.Values(cur)), MaxEndpointsPerSlice: 4})
		return sliceplan.Diff("web", swh.UID, "node-a", desired, cur)
	}
	_, err := pub.Apply(t.Context(), plan(pods...))
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"web-http-node-a", "web-http---1-node-a"}, slices.Collect(maps.Keys(existing())))
	chunk := existing()["web-http---1-node-a"]
	moved := chunk.Endpoints[0].Addresses[0]

	// Two pods left, one in each slice: the port merges into its first slice.
	merge := plan(pods[0], pods[4])
	require.Len(t, merge.Update, 1)
	require.Equal(t, "web-http-node-a", merge.Update[0].Name)
	require.Len(t, merge.Delete, 1)
	require.Equal(t, "web-http---1-node-a", merge.Delete[0].Name)

	lift := refuseSliceUpdates(t, c, ns, "web")
	require.Eventually(t, func() bool { return refused(t, c, ns, "web-http-node-a") }, 30*time.Second, 50*time.Millisecond, "the policy refuses the update")
	_, err = pub.Apply(t.Context(), merge)
	require.ErrorContains(t, err, "updating EndpointSlice web-http-node-a")
	require.ErrorContains(t, err, "waits for the retry of the failed write")
	assert.Zero(t, testutil.ToFloat64(m.SliceWrites.WithLabelValues(metrics.OpDelete)))
	kept := existing()["web-http---1-node-a"]
	require.NotNil(t, kept, "the chunk is kept while the first slice does not list its endpoint")
	assert.Contains(t, addresses(kept), moved)

	// The retry once updates are allowed again: the first slice lists both, then the chunk goes.
	lift()
	require.Eventually(t, func() bool {
		_, _ = pub.Apply(t.Context(), plan(pods[0], pods[4]))
		cur := existing()
		first, chunk := cur["web-http-node-a"], cur["web-http---1-node-a"]
		return first != nil && chunk == nil && slices.Contains(addresses(first), moved)
	}, 30*time.Second, 100*time.Millisecond, "the retry writes the first slice and deletes the chunk")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.SliceWrites.WithLabelValues(metrics.OpDelete)))
}

func addresses(s *discoveryv1.EndpointSlice) []string {
	var out []string
	for _, e := range s.Endpoints {
		out = append(out, e.Addresses...)
	}
	return out
}
