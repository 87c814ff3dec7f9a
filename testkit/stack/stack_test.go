// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package stack_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

func TestMain(m *testing.M) { cluster.RunIsolated(m) }

const webManifest = `
apiVersion: network.deckhouse.io/v1alpha1
kind: ServiceWithHealthchecks
metadata:
  name: web
spec:
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: 8080
  healthcheck:
    initialDelaySeconds: 0
    periodSeconds: 1
    probes:
    - mode: HTTP
      failureThreshold: 1
      http:
        targetPort: 8080
        path: /healthz
`

// The stack runs the real programs: the controller replicas elect one leader, every node's
// agent renews its Lease, and a resource with an HTTP probe gets its pod published and routed
// through the ClusterIP by kube-proxy; the controls then act on the programs by PID.
func TestTheProductRunsOnTheHarness(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	c := s.Cluster
	require.Equal(t, []string{"node-a", "node-b"}, s.Nodes())

	leader, err := s.Leader()
	require.NoError(t, err, "one controller replica leads")
	assert.Contains(t, []int{0, 1}, leader)
	var election coordinationv1.Lease
	require.NoError(t, s.Client().Get(t.Context(), client.ObjectKey{Namespace: stack.Namespace, Name: stack.LeaderElectionID}, &election))
	require.NotNil(t, election.Spec.HolderIdentity, "the leader holds the election Lease")

	renewTimes := map[string]time.Time{}
	for _, node := range s.Nodes() {
		l := agentLease(t, s, node)
		require.NotNil(t, l.Spec.HolderIdentity)
		assert.Equal(t, node, *l.Spec.HolderIdentity, "the agent of %s renews its own Lease", node)
		renewTimes[node] = l.Spec.RenewTime.Time
		assert.NotZero(t, s.AgentPID(node))
	}
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		for _, node := range s.Nodes() {
			assert.True(ct, agentLease(t, s, node).Spec.RenewTime.After(renewTimes[node]), "the agent of %s renews again", node)
		}
	}, 30*time.Second, 100*time.Millisecond)

	ns := c.Env.CreateNamespaceForTest(t, "stack")
	pod := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-0", Node: "node-b", Labels: map[string]string{"app": "web"}})
	srv := pod.ServeHTTP(t, 8080)
	require.NoError(t, s.ApplyYAML(t.Context(), ns, []byte(webManifest)))

	c.WaitProgrammed(t, ns+"/web", 80, pod)
	res := c.Requests(t, cluster.TrafficOptions{Service: ns + "/web", Port: 80, Count: 20})
	assert.Equal(t, []string{pod.Key()}, res.Pods(), "%s", res)
	assert.Empty(t, res.Failed(), "%s", res)
	assert.Positive(t, srv.Hits(), "the probe and the requests reached the pod's server")

	t.Run("a restarted agent is a new process that renews its Lease", func(t *testing.T) {
		before := s.AgentPID("node-b")
		require.NoError(t, s.RestartAgent(t.Context(), "node-b"))
		assert.NotEqual(t, before, s.AgentPID("node-b"))
		assert.NotZero(t, s.AgentPID("node-b"))
		c.WaitProgrammed(t, ns+"/web", 80, pod)
	})

	t.Run("restarting the leader hands leadership to the other replica", func(t *testing.T) {
		before := s.ControllerPID(leader)
		oldLeader, newLeader, err := s.RestartLeader(t.Context())
		require.NoError(t, err)
		assert.Equal(t, leader, oldLeader)
		assert.NotEqual(t, oldLeader, newLeader)
		assert.NotEqual(t, before, s.ControllerPID(oldLeader), "the old leader runs again as a new process")
		assert.NotZero(t, s.ControllerPID(oldLeader))
		now, err := s.Leader()
		require.NoError(t, err)
		assert.Equal(t, newLeader, now)
	})

	t.Run("a deleted node's agent stops and its slices go", func(t *testing.T) {
		var before discoveryv1.EndpointSliceList
		require.NoError(t, s.Client().List(t.Context(), &before, client.InNamespace(ns),
			client.MatchingLabels{discoveryv1.LabelManagedBy: wellknown.ManagedBy}))
		require.Len(t, before.Items, 1, "the agent of node-b published the pod's slice")
		assert.Equal(t, "node-b", slicemeta.NodeOf(&before.Items[0]))

		require.NoError(t, s.DeleteNode(t.Context(), "node-b"))
		assert.Zero(t, s.AgentPID("node-b"))
		assert.Equal(t, []string{"node-a"}, s.Nodes())
		var node corev1.Node
		assert.True(t, apierrors.IsNotFound(s.Client().Get(t.Context(), client.ObjectKey{Name: "node-b"}, &node)))
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			var list discoveryv1.EndpointSliceList
			require.NoError(ct, s.Client().List(t.Context(), &list, client.InNamespace(ns),
				client.MatchingLabels{discoveryv1.LabelManagedBy: wellknown.ManagedBy}))
			assert.Empty(ct, list.Items, "the controller removes the slices of a node that no longer exists")
		}, time.Minute, 100*time.Millisecond)
		require.Error(t, s.StartAgent(t.Context(), "node-b"), "a deleted node's agent cannot start")
	})
}

func agentLease(t *testing.T, s *stack.Stack, node string) *coordinationv1.Lease {
	t.Helper()
	var l coordinationv1.Lease
	require.NoError(t, s.Client().Get(t.Context(), client.ObjectKey{Namespace: stack.Namespace, Name: wellknown.AgentLeaseName(node)}, &l))
	require.NotNil(t, l.Spec.RenewTime)
	return &l
}
