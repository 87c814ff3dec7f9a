package lease

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
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
	err := env.Client.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: slicemeta.AgentLeaseName(node)}, &l)
	return &l, err
}

func TestRenewerCreatesAndKeepsRenewingTheNodeLease(t *testing.T) {
	tests := map[string]struct {
		node     string
		wantName string
	}{
		"a short node name names the Lease":           {node: "worker-1", wantName: "swh-agent-worker-1"},
		"a node name too long for a name is digested": {node: strings.Repeat("n", 250), wantName: "swh-agent-" + slicemeta.NodeDigest(strings.Repeat("n", 250))},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ns := env.CreateNamespaceForTest(t, "lease")
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
			assert.Equal(t, tc.node, first.Annotations[slicemeta.AnnotationNode])
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
	for _, o := range []client.Object{role, binding} {
		require.NoError(t, env.Client.Create(t.Context(), o))
	}
}
