// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// gcNode is a node of these tests only: a Node object (no network of its own; its pod is never
// dialed, the resource has no probes) that the test deletes.
const gcNode = "node-gc"

// podOn creates a running, ready Pod object on node with address podIP (never dialed).
func podOn(t *testing.T, c *cluster.Cluster, ns, name, node, podIP string, labels map[string]string) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "testkit.invalid/pod:latest", Ports: vmPorts}}},
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), pod))
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: podIP, PodIPs: []corev1.PodIP{{IP: podIP}}, StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "app", Image: "testkit.invalid/pod:latest", Ready: true, Started: new(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}},
	}
	require.NoError(t, c.Env.Client.Status().Update(t.Context(), pod))
}

// unprobed creates a resource without probes (its ports follow the pods' Ready condition).
func unprobed(t *testing.T, c *cluster.Cluster, ns, name string, selector map[string]string) *v1alpha1.ServiceWithHealthchecks {
	t.Helper()
	swh := &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Selector: selector, Type: corev1.ServiceTypeClusterIP,
			Ports: []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromString("web")), namedPort("health", 9000, intstr.FromString("health"))},
		},
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), swh))
	return swh
}

// owners maps the slices of a resource to the UIDs of their owners.
func owners(ctx context.Context, c *cluster.Cluster, ns, resource string) (map[string]types.UID, error) {
	var list discoveryv1.EndpointSliceList
	if err := c.Env.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{wellknown.LabelResource: resource}); err != nil {
		return nil, err
	}
	out := map[string]types.UID{}
	for _, s := range list.Items {
		var uid types.UID
		if len(s.OwnerReferences) == 1 {
			uid = s.OwnerReferences[0].UID
		}
		out[s.Name] = uid
	}
	return out, nil
}

func eventuallyOwners(t *testing.T, c *cluster.Cluster, ns, resource string, want map[string]types.UID, msg string) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		got, err := owners(t.Context(), c, ns, resource)
		require.NoError(ct, err)
		assert.Equal(ct, want, got)
	}, 60*time.Second, 50*time.Millisecond, msg)
}

// Issue 7, test 7, with real agents and the real controller program (envtest runs no garbage
// collector: the controller's own collection removes the slices, DESIGN §5):
//   - a resource deleted while no controller runs and created again with the same name: the
//     agents publish nothing for it while its Service is the old incarnation's; once the
//     controller runs, the slices of the old incarnation are collected (or, on a live node,
//     taken over by its agent), and the agent of the node whose agent was stopped, started
//     again, publishes the new incarnation's;
//   - a node deleted: its slices are removed, the other node's stay;
//   - the resource deleted: all its slices are removed (the agents never delete them).
func TestGarbageSlicesOfDeletedNodesAndResourcesAreCollected(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "gc")
	labels := map[string]string{"app": "web"}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: gcNode, Labels: map[string]string{corev1.LabelHostname: gcNode}}}
	require.NoError(t, c.Env.Client.Create(t.Context(), node))
	t.Cleanup(func() {
		if err := c.Env.Client.Delete(context.Background(), node); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting Node %s: %v", gcNode, err)
		}
	})
	a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-a", Node: "node-a", Labels: labels, ContainerPorts: vmPorts, ObjectOnly: true})
	const gcIP = "198.51.100.7" // TEST-NET-2: never dialed
	podOn(t, c, ns, "web-gc", gcNode, gcIP, labels)
	old := unprobed(t, c, ns, "web", labels)
	ctl := startController(t, c, ns)
	logsA := &logLines{}
	startAgent(t, c, "node-a", func(o *agent.Options) { o.Logger = logsA.logger() })
	agentGC := startAgent(t, c, gcNode)
	all := func(uid types.UID) map[string]types.UID {
		return map[string]types.UID{"web-http-node-a": uid, "web-health-node-a": uid, "web-http-" + gcNode: uid, "web-health-" + gcNode: uid}
	}
	eventuallyOwners(t, c, ns, "web", all(old.UID), "both agents publish the first incarnation's slices")
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-a": {ip(a): "TTF"}, "web-health-node-a": {ip(a): "TTF"},
		"web-http-" + gcNode: {gcIP: "TTF"}, "web-health-" + gcNode: {gcIP: "TTF"},
	})

	// Deleted and created again while no controller runs and node-gc's agent is stopped.
	agentGC.stop()
	ctl.stop(t)
	require.NoError(t, c.Env.Client.Delete(t.Context(), old))
	require.Eventually(t, func() bool {
		return apierrors.IsNotFound(c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(old), &v1alpha1.ServiceWithHealthchecks{}))
	}, 30*time.Second, 50*time.Millisecond)
	recreated := unprobed(t, c, ns, "web", labels)
	require.NotEqual(t, old.UID, recreated.UID)
	// The Service "web" is still the deleted incarnation's: until the controller replaces it
	// and says so in the status, node-a's agent publishes nothing for the new one (DESIGN §8).
	require.Eventually(t, func() bool { return logsA.contains("withholding", `"namespace"="`+ns+`"`) },
		time.Minute, 50*time.Millisecond, "node-a's agent reconciled the new incarnation")
	eventuallyOwners(t, c, ns, "web", all(old.UID), "nobody takes the slices over while the Service is the deleted incarnation's")

	ctl = startController(t, c, ns)
	eventuallyOwners(t, c, ns, "web", map[string]types.UID{"web-http-node-a": recreated.UID, "web-health-node-a": recreated.UID},
		"the controller replaces the Service and collects the old incarnation's slices of node-gc; node-a's agent publishes the new one's")
	// node-a's old slices are collected too, or taken over by its agent first.
	assert.GreaterOrEqual(t, ctl.requireMetric(t, `swh_controller_garbage_collected_slices_total{reason="OwnerMismatch"}`), 2.0)
	agentGC = startAgent(t, c, gcNode)
	eventuallyOwners(t, c, ns, "web", all(recreated.UID), "node-gc's agent publishes the new incarnation's slices")

	// The node is deleted (its agent goes with it).
	agentGC.stop()
	require.NoError(t, c.Env.Client.Delete(t.Context(), node))
	eventuallyOwners(t, c, ns, "web", map[string]types.UID{"web-http-node-a": recreated.UID, "web-health-node-a": recreated.UID},
		"the deleted node's slices are removed, the other node's stay")
	assert.Equal(t, 2.0, ctl.requireMetric(t, `swh_controller_garbage_collected_slices_total{reason="NodeDeleted"}`))

	// The resource is deleted: all its slices go, though node-a's agent still runs.
	require.NoError(t, c.Env.Client.Delete(t.Context(), recreated))
	eventuallyOwners(t, c, ns, "web", map[string]types.UID{}, "every slice of the deleted resource is removed")
	assert.Equal(t, 2.0, ctl.requireMetric(t, `swh_controller_garbage_collected_slices_total{reason="ResourceDeleted"}`))
}
