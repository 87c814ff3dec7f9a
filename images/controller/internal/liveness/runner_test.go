// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package liveness

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/index"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/slicewrite"
)

// fakeAgent renews a node's Lease the way the agent does, until stopped.
type fakeAgent struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// startFakeAgent creates the Node unless it exists and renews its Lease, owned by the Node.
func startFakeAgent(t *testing.T, ns, node string) *fakeAgent {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	if err := env.Client.Create(t.Context(), n); apierrors.IsAlreadyExists(err) {
		require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(n), n))
	} else {
		require.NoError(t, err)
	}
	now := metav1.NewMicroTime(time.Now())
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: wellknown.AgentLeaseName(node), Annotations: map[string]string{wellknown.AnnotationNode: node},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: n.UID}},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
	}
	require.NoError(t, env.Client.Create(t.Context(), l))
	ctx, cancel := context.WithCancel(t.Context())
	a := &fakeAgent{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var cur coordinationv1.Lease
			if env.Client.Get(ctx, client.ObjectKeyFromObject(l), &cur) != nil {
				continue
			}
			cur.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
			_ = env.Client.Update(ctx, &cur)
		}
	}()
	t.Cleanup(a.stop)
	return a
}

func (a *fakeAgent) stop() {
	a.cancel()
	<-a.done
}

func TestRunnerWithdrawsAfterTheGraceAndNotBefore(t *testing.T) {
	const grace = 4 * time.Second
	nodes := []string{"wd-r1", "wd-r2", "wd-r3"}
	w := newWorld(t, nodes...) // slices and namespace; its tracker is not used here

	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:  env.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&discoveryv1.EndpointSlice{}: {Label: labels.SelectorFromSet(labels.Set{discoveryv1.LabelManagedBy: wellknown.ManagedBy})},
		}},
	})
	require.NoError(t, err)
	require.NoError(t, index.Register(t.Context(), mgr.GetFieldIndexer()))
	r, err := setupRunner(t, mgr, w.ns, grace)
	require.NoError(t, err)
	m := r.Withdrawer.Metrics

	agents := map[string]*fakeAgent{}
	for _, n := range nodes {
		agents[n] = startFakeAgent(t, w.ns, n)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, mgr.Start(ctx)) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	require.Eventually(t, func() bool { return testutil.ToFloat64(m.KnownAgents) == 3 }, 30*time.Second, 50*time.Millisecond,
		"the runner sees the three agents")

	isReady := func(node string) bool { return ready(t, w, node) }

	// Stop one agent: at half the grace its endpoints are still ready...
	agents["wd-r1"].stop()
	require.Never(t, func() bool { return !isReady("wd-r1") }, grace/2, 100*time.Millisecond,
		"endpoints of a silent agent stay ready within the grace")
	// ...and after the grace they are withdrawn, the slice kept.
	require.Eventually(t, func() bool { return !isReady("wd-r1") }, 3*grace, 100*time.Millisecond,
		"the endpoints of a stale agent are withdrawn after the grace")
	assert.True(t, isReady("wd-r2"), "a live agent's endpoints are untouched")
	assert.True(t, isReady("wd-r3"), "a live agent's endpoints are untouched")
	assert.InDelta(t, 1, testutil.ToFloat64(m.WithdrawnSlices), 0)

	// Stop a second agent: two of three look stale, more than half, and the guard holds (from
	// half the second one's grace on, the first being stale), and goes on holding once both
	// are stale.
	agents["wd-r2"].stop()
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.GuardHolding) == 1 }, 3*grace, 100*time.Millisecond,
		"the guard holds once two of three agents look stale")
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.StaleAgents) == 2 }, 3*grace, 100*time.Millisecond,
		"the second agent turns stale")
	assert.InDelta(t, 1, testutil.ToFloat64(m.GuardHolding), 0, "the guard holds with both stale")
	assert.True(t, isReady("wd-r2"), "nothing is withdrawn while the guard holds")
	assert.InDelta(t, 1, testutil.ToFloat64(m.WithdrawnSlices), 0)
}

func TestAgentLease(t *testing.T) {
	now := metav1.NewMicroTime(time.Now())
	tests := map[string]struct {
		lease    coordinationv1.Lease
		wantNode string
		wantOK   bool
	}{
		"an agent's Lease names its node by annotation": {
			lease:    coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "swh-agent-n1", Annotations: map[string]string{wellknown.AnnotationNode: "n1"}}, Spec: coordinationv1.LeaseSpec{RenewTime: &now}},
			wantNode: "n1", wantOK: true,
		},
		"the holder names the node when the annotation is missing": {
			lease:    coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "swh-agent-n1"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("n1"), RenewTime: &now}},
			wantNode: "n1", wantOK: true,
		},
		"a Lease that is not an agent's is ignored": {
			lease: coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "service-with-healthchecks-controller"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("x"), RenewTime: &now}},
		},
		"a Lease never renewed is ignored": {
			lease: coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "swh-agent-n1"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("n1")}},
		},
		"a Lease whose name does not match its node is ignored": {
			lease: coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "swh-agent-n2"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("n1"), RenewTime: &now}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			node, renew, ok := agentLease(&tc.lease)
			assert.Equal(t, tc.wantOK, ok)
			assert.Equal(t, tc.wantNode, node)
			if ok {
				assert.True(t, renew.Equal(now.Time))
			}
		})
	}
}

func TestAgentRenewals(t *testing.T) {
	renewed := func(node string, at int64) coordinationv1.Lease {
		return coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: wellknown.AgentLeaseName(node), Annotations: map[string]string{wellknown.AnnotationNode: node}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), RenewTime: ptr.To(metav1.NewMicroTime(time.Unix(at, 0)))},
		}
	}
	election := coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "service-with-healthchecks-controller"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("controller-0"), RenewTime: ptr.To(metav1.NewMicroTime(time.Unix(9, 0)))},
	}
	tests := map[string]struct {
		leases      []coordinationv1.Lease
		nodes       []string
		wantRenewal map[string]int64
		wantOrphans []string
	}{
		"the Leases of existing nodes are read": {
			leases: []coordinationv1.Lease{renewed("n1", 1), renewed("n2", 2)}, nodes: []string{"n1", "n2"},
			wantRenewal: map[string]int64{"n1": 1, "n2": 2},
		},
		"the Lease of a node that does not exist is ignored and named": {
			leases: []coordinationv1.Lease{renewed("n1", 1), renewed("gone-b", 2), renewed("gone-a", 3)}, nodes: []string{"n1"},
			wantRenewal: map[string]int64{"n1": 1}, wantOrphans: []string{"gone-a", "gone-b"},
		},
		"a Lease that is not an agent's is neither read nor named": {
			leases: []coordinationv1.Lease{election, renewed("n1", 1)}, nodes: []string{"n1", "controller-0"},
			wantRenewal: map[string]int64{"n1": 1},
		},
		"no node at all ignores every agent Lease": {
			leases: []coordinationv1.Lease{renewed("n1", 1)}, wantRenewal: map[string]int64{}, wantOrphans: []string{"n1"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			renewals, orphans := AgentRenewals(tc.leases, sets.New(tc.nodes...))
			got := map[string]int64{}
			for n, at := range renewals {
				got[n] = at.Unix()
			}
			assert.Equal(t, tc.wantRenewal, got)
			assert.Equal(t, tc.wantOrphans, orphans)
		})
	}
}

func TestDefaultPeriod(t *testing.T) {
	tests := map[string]struct{ grace, want time.Duration }{
		"the default grace is observed every 5 s":       {grace: 40 * time.Second, want: 5 * time.Second},
		"a short grace is observed at least each 0.5 s": {grace: time.Second, want: 500 * time.Millisecond},
		"a long grace is observed at most each 5 s":     {grace: 10 * time.Minute, want: 5 * time.Second},
		"a middle grace is observed each eighth":        {grace: 16 * time.Second, want: 2 * time.Second},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { assert.Equal(t, tc.want, DefaultPeriod(tc.grace)) })
	}
}

// TestRunnerRestartsTheGraceAfterItCouldNotSeeTheLeases takes the runner's permission to list
// Leases away for longer than the grace (the controller is blind, as in an API outage), stops an
// agent meanwhile, and gives the permission back: the silent agent is not withdrawn on the spot
// but only a full grace after the controller sees again.
func TestRunnerRestartsTheGraceAfterItCouldNotSeeTheLeases(t *testing.T) {
	const grace = 4 * time.Second
	nodes := []string{"wd-b1", "wd-b2", "wd-b3"}
	w := newWorld(t, nodes...)
	binding := grantLeaseList(t, w.ns, "controller")
	reader, err := env.ServiceAccountClient(w.ns, "controller")
	require.NoError(t, err)

	tr := NewTracker(nil, grace)
	m, err := metrics.NewLiveness(prometheus.NewRegistry())
	require.NoError(t, err)
	r := &Runner{
		Withdrawer: &Withdrawer{Client: w.client, Slices: slicewrite.New(w.client, nil, m), Tracker: tr, Metrics: m, Log: logr.Discard()},
		Leases:     reader, Nodes: env.Client, Namespace: w.ns, Log: logr.Discard(),
	}
	agents := map[string]*fakeAgent{}
	for _, n := range nodes {
		agents[n] = startFakeAgent(t, w.ns, n)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, r.Start(ctx)) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.KnownAgents) == 3 }, 30*time.Second, 50*time.Millisecond)

	// An agent stops, and the runner sees its last renewal.
	agents["wd-b1"].stop()
	var last coordinationv1.Lease
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKey{Namespace: w.ns, Name: wellknown.AgentLeaseName("wd-b1")}, &last))
	require.Eventually(t, func() bool {
		renew, _, ok := tr.Seen("wd-b1")
		return ok && renew.Equal(last.Spec.RenewTime.Time)
	}, 30*time.Second, 20*time.Millisecond, "the runner sees the stopped agent's last renewal")

	// Blind: the runner can no longer list the Leases.
	require.NoError(t, env.Client.Delete(t.Context(), binding))
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.Errors) > 0 }, 30*time.Second, 50*time.Millisecond,
		"the runner fails to list the Leases")
	require.Eventually(t, func() bool { return len(tr.Judge().Stale) == 3 }, 3*grace, 50*time.Millisecond,
		"blind for longer than the grace, every agent looks stale")
	assert.True(t, ready(t, w, "wd-b1"), "nothing is withdrawn while blind (guard)")

	// Sight returns: the grace restarts, so the silent agent is not stale yet.
	grantLeaseList(t, w.ns, "controller")
	require.Eventually(t, func() bool { return len(tr.Judge().Stale) == 0 }, 30*time.Second, 50*time.Millisecond,
		"seeing the Leases again restarts the grace of every agent")
	assert.True(t, ready(t, w, "wd-b1"), "the silent agent is not withdrawn the moment the controller sees again")
	// A full grace later it is.
	require.Eventually(t, func() bool { return !ready(t, w, "wd-b1") }, 3*grace, 100*time.Millisecond,
		"the silent agent is withdrawn a grace after the controller sees again")
	assert.True(t, ready(t, w, "wd-b2"))
	assert.True(t, ready(t, w, "wd-b3"))
}

func ready(t *testing.T, w *world, node string) bool {
	t.Helper()
	e := w.get(t, node).Endpoints[0].Conditions
	return ptr.Deref(e.Ready, true) && ptr.Deref(e.Serving, true)
}

// grantLeaseList lets the service account list Leases in ns and returns the binding.
func grantLeaseList(t *testing.T, ns, sa string) *rbacv1.RoleBinding {
	t.Helper()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "leases"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"list"}}},
	}
	if err := env.Client.Create(t.Context(), role); err != nil && !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "leases"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "leases"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: sa}},
	}
	require.NoError(t, env.Client.Create(t.Context(), binding))
	return binding
}

// TestANewLeaderRestartsTheGrace stops the leader while an agent has been silent for half the
// grace: the new leader does not withdraw it at the old leader's deadline, only a full grace
// after it took over, and the standby never judged anything.
func TestANewLeaderRestartsTheGrace(t *testing.T) {
	const grace = 4 * time.Second
	nodes := []string{"wd-l1", "wd-l2", "wd-l3"}
	w := newWorld(t, nodes...)
	agents := map[string]*fakeAgent{}
	for _, n := range nodes {
		agents[n] = startFakeAgent(t, w.ns, n)
	}
	a, stopA := startReplica(t, w.ns, grace)
	require.Eventually(t, func() bool { return testutil.ToFloat64(a.Withdrawer.Metrics.KnownAgents) == 3 }, 30*time.Second, 50*time.Millisecond,
		"the first replica leads and sees the agents")
	b, _ := startReplica(t, w.ns, grace)

	agents["wd-l1"].stop()
	var last coordinationv1.Lease
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKey{Namespace: w.ns, Name: wellknown.AgentLeaseName("wd-l1")}, &last))
	var silentSince time.Time
	require.Eventually(t, func() bool {
		renew, changed, ok := a.Withdrawer.Tracker.Seen("wd-l1")
		silentSince = changed
		return ok && renew.Equal(last.Spec.RenewTime.Time)
	}, 30*time.Second, 20*time.Millisecond, "the leader saw the stopped agent's last renewal")
	require.Eventually(t, func() bool { return time.Since(silentSince) > grace/2 }, 3*grace, 20*time.Millisecond)
	assert.InDelta(t, 0, testutil.ToFloat64(b.Withdrawer.Metrics.KnownAgents), 0, "the standby judges nothing")
	stopA()

	require.Eventually(t, func() bool { return testutil.ToFloat64(b.Withdrawer.Metrics.KnownAgents) == 3 }, 30*time.Second, 50*time.Millisecond,
		"the standby takes over")
	tookOver := time.Now()
	_, changed, ok := b.Withdrawer.Tracker.Seen("wd-l1")
	require.True(t, ok)
	assert.False(t, changed.Before(silentSince.Add(grace/2)), "the new leader's grace for the silent agent starts at its own start")
	require.Eventually(t, func() bool { return !ready(t, w, "wd-l1") }, 3*grace, 100*time.Millisecond,
		"the new leader withdraws the silent agent after its own grace")
	assert.Greater(t, time.Since(silentSince), grace, "withdrawn only after the grace")
	_, changed, _ = b.Withdrawer.Tracker.Seen("wd-l1")
	assert.True(t, changed.Add(grace).Before(time.Now()), "a full grace passed on the new leader's clock")
	assert.False(t, changed.After(tookOver))
	assert.True(t, ready(t, w, "wd-l2"))
	assert.True(t, ready(t, w, "wd-l3"))
}

// startReplica starts a controller replica with leader election and the liveness runner; the
// returned function stops it (releasing leadership) and waits for it.
func startReplica(t *testing.T, ns string, grace time.Duration) (*Runner, func()) {
	t.Helper()
	leaseDuration, renewDeadline, retryPeriod := 3*time.Second, 2*time.Second, 200*time.Millisecond
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                        env.Scheme,
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		LeaderElection:                true,
		LeaderElectionID:              "swh-liveness-test",
		LeaderElectionNamespace:       ns,
		LeaderElectionResourceLock:    "leases",
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &leaseDuration,
		RenewDeadline:                 &renewDeadline,
		RetryPeriod:                   &retryPeriod,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&discoveryv1.EndpointSlice{}: {Label: labels.SelectorFromSet(labels.Set{discoveryv1.LabelManagedBy: wellknown.ManagedBy})},
		}},
	})
	require.NoError(t, err)
	require.NoError(t, index.Register(t.Context(), mgr.GetFieldIndexer()))
	r, err := setupRunner(t, mgr, ns, grace)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert.NoError(t, mgr.Start(ctx))
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return r, stop
}

// setupRunner adds the liveness runner to mgr as the program does: its metrics on a fresh
// registry, withdrawing through a slice writer of mgr's client.
func setupRunner(t *testing.T, mgr ctrl.Manager, ns string, grace time.Duration) (*Runner, error) {
	t.Helper()
	m, err := metrics.NewLiveness(prometheus.NewRegistry())
	require.NoError(t, err)
	a, err := Setup(mgr, Options{Namespace: ns, Grace: grace, Writer: slicewrite.New(mgr.GetClient(), nil, m), Metrics: m})
	if err != nil {
		return nil, err
	}
	return a.Runner, nil
}
