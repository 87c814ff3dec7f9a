// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package lease

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

var env *controlplane.Env

func TestMain(m *testing.M) { controlplane.Main(m, controlplane.Options{}, &env) }

// run starts a renewer and returns a function that stops it and waits for Start to return.
func run(t *testing.T, r *Renewer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	stopped := false
	stop = func() {
		t.Helper()
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err, "Start returns nil when its context ends")
		case <-time.After(30 * time.Second):
			t.Error("the renewer did not stop within 30 s of its context ending")
		}
	}
	t.Cleanup(stop)
	return stop
}

func getLease(t *testing.T, ns, node string) (*coordinationv1.Lease, error) {
	t.Helper()
	var l coordinationv1.Lease
	err := env.Client.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: wellknown.AgentLeaseName(node)}, &l)
	return &l, err
}

// createNode creates the Node name and deletes it when the test ends.
func createNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	require.NoError(t, env.Client.Create(t.Context(), n))
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), n) })
	return n
}

// ownedBy asserts that the Lease's only owner is the Node n (its UID).
func ownedBy(t assert.TestingT, l *coordinationv1.Lease, n *corev1.Node) bool {
	return assert.Equal(t, []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}}, l.OwnerReferences,
		"the Lease is owned by its Node")
}

func TestRenewerCreatesAndKeepsRenewingTheNodeLease(t *testing.T) {
	tests := map[string]struct {
		node     string
		wantName string
	}{
		"a short node name names the Lease":           {node: "worker-1", wantName: "swh-agent-worker-1"},
		"a node name too long for a name is digested": {node: strings.Repeat("n", 250), wantName: "swh-agent-" + wellknown.NodeDigest(strings.Repeat("n", 250))},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ns := env.CreateNamespaceForTest(t, "lease")
			node := createNode(t, tc.node)
			run(t, &Renewer{Client: env.Client, Namespace: ns, Node: tc.node, Interval: 50 * time.Millisecond, Log: logr.Discard()})

			var first *coordinationv1.Lease
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				l, err := getLease(t, ns, tc.node)
				require.NoError(c, err)
				first = l
			}, 30*time.Second, 20*time.Millisecond)
			assert.Equal(t, tc.wantName, first.Name)
			require.NotNil(t, first.Spec.HolderIdentity)
			assert.Equal(t, tc.node, *first.Spec.HolderIdentity)
			require.NotNil(t, first.Spec.LeaseDurationSeconds)
			assert.Equal(t, int32(40), *first.Spec.LeaseDurationSeconds)
			assert.Equal(t, tc.node, first.Annotations[wellknown.AnnotationNode])
			ownedBy(t, first, node)
			require.NotNil(t, first.Spec.RenewTime)

			require.EventuallyWithT(t, func(c *assert.CollectT) {
				l, err := getLease(t, ns, tc.node)
				require.NoError(c, err)
				require.NotNil(c, l.Spec.RenewTime)
				assert.True(c, l.Spec.RenewTime.After(first.Spec.RenewTime.Time), "renewTime advances")
			}, 30*time.Second, 20*time.Millisecond)
		})
	}
}

func TestRenewerSurvivesAPIErrorsAndRenewsOnceTheyEnd(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "lease")
	createNode(t, "worker-2")
	sa := "agent"
	c, err := env.ServiceAccountClient(ns, sa)
	require.NoError(t, err)

	// Without RBAC every renewal is forbidden.
	r := &Renewer{Client: c, Namespace: ns, Node: "worker-2", Interval: 50 * time.Millisecond, Log: logr.Discard()}
	require.Error(t, r.Renew(t.Context()), "a renewal without permission fails")
	stop := run(t, r)

	// The renewer keeps trying: once the permission is granted, the Lease appears.
	grant(t, ns, sa)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		l, err := getLease(t, ns, "worker-2")
		require.NoError(c, err)
		assert.Equal(c, "worker-2", *l.Spec.HolderIdentity)
	}, 30*time.Second, 20*time.Millisecond)
	stop()
}

func TestRenewerRefusesToStartWithoutNodeOrNamespace(t *testing.T) {
	tests := map[string]Renewer{
		"a renewer without a node fails":      {Client: env.Client, Namespace: "x"},
		"a renewer without a namespace fails": {Client: env.Client, Node: "n"},
	}
	for name, r := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Error(t, r.Start(t.Context()))
		})
	}
}

func TestRenewerRunsOnEveryAgent(t *testing.T) {
	assert.False(t, (&Renewer{}).NeedLeaderElection())
}

// grant gives the service account ns/sa what the chart gives the agent for its Lease: leases in
// ns, and reading Nodes (the Lease's owner).
func grant(t *testing.T, ns, sa string) {
	t.Helper()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lease"},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
			Verbs: []string{"get", "create", "update"},
		}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lease"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "lease"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: sa}},
	}
	nodes := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "lease-nodes-" + ns},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}},
	}
	nodesBinding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "lease-nodes-" + ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: nodes.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: sa}},
	}
	for _, o := range []client.Object{role, binding, nodes, nodesBinding} {
		require.NoError(t, env.Client.Create(t.Context(), o))
	}
}

// TestTheLeaseIsWrittenOnlyForANodeThatExists: without its Node the renewer writes no Lease
// (one would be owned by nothing and outlive the node) and says why; once the Node exists, the
// Lease is created, owned by it.
func TestTheLeaseIsWrittenOnlyForANodeThatExists(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "lease")
	r := &Renewer{Client: env.Client, Namespace: ns, Node: "worker-late", Log: logr.Discard()}
	err := r.Renew(t.Context())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "node worker-late does not exist")
	_, err = getLease(t, ns, "worker-late")
	assert.True(t, apierrors.IsNotFound(err), "no Lease without a Node, got %v", err)

	node := createNode(t, "worker-late")
	require.NoError(t, r.Renew(t.Context()))
	l, err := getLease(t, ns, "worker-late")
	require.NoError(t, err)
	ownedBy(t, l, node)
}

// TestTheLeaseFollowsARecreatedNode: the Node is deleted (its Lease stays: envtest runs no
// garbage collector) and the renewer stops renewing; the Node is created again under the same
// name with a new UID, and the renewer points the Lease's owner at it and renews again.
func TestTheLeaseFollowsARecreatedNode(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "lease")
	const name = "worker-reborn"
	first := createNode(t, name)
	m := metrics.New(nil)
	run(t, &Renewer{Client: env.Client, Namespace: ns, Node: name, Interval: 50 * time.Millisecond,
		NodeCheckInterval: 100 * time.Millisecond, Log: logr.Discard(), Metrics: m})
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		l, err := getLease(t, ns, name)
		require.NoError(c, err)
		ownedBy(c, l, first)
	}, 30*time.Second, 20*time.Millisecond, "the Lease is owned by the first Node")

	require.NoError(t, env.Client.Delete(t.Context(), first))
	errorsBefore := testutil.ToFloat64(m.LeaseRenewErrors)
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.LeaseRenewErrors) >= errorsBefore+2 }, 30*time.Second, 20*time.Millisecond,
		"renewals fail while the Node is gone")
	stalled, err := getLease(t, ns, name)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.LeaseRenewErrors) >= errorsBefore+4 }, 30*time.Second, 20*time.Millisecond)
	still, err := getLease(t, ns, name)
	require.NoError(t, err)
	assert.Equal(t, stalled.ResourceVersion, still.ResourceVersion, "a Lease whose Node is gone is not renewed")

	second := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	require.NoError(t, env.Client.Create(t.Context(), second))
	require.NotEqual(t, first.UID, second.UID)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		l, err := getLease(t, ns, name)
		require.NoError(c, err)
		ownedBy(c, l, second)
		assert.True(c, l.Spec.RenewTime.After(still.Spec.RenewTime.Time), "renewed again")
	}, 30*time.Second, 20*time.Millisecond, "the Lease's owner follows the re-created Node")
}
