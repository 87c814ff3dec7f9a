package withdraw

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
)

// fakeAgent renews a node's Lease the way the agent does, until stopped.
type fakeAgent struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func startFakeAgent(t *testing.T, ns, node string) *fakeAgent {
	t.Helper()
	now := metav1.NewMicroTime(time.Now())
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: slicemeta.AgentLeaseName(node), Annotations: map[string]string{slicemeta.AnnotationNode: node}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
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
			&discoveryv1.EndpointSlice{}: {Label: labels.SelectorFromSet(labels.Set{discoveryv1.LabelManagedBy: slicemeta.ManagedBy})},
		}},
	})
	require.NoError(t, err)
	r, err := Setup(mgr, prometheus.NewRegistry(), w.ns, grace)
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

	ready := func(node string) bool {
		e := w.get(t, node).Endpoints[0].Conditions
		return ptr.Deref(e.Ready, true) && ptr.Deref(e.Serving, true)
	}

	// Stop one agent: at half the grace its endpoints are still ready...
	agents["wd-r1"].stop()
	require.Never(t, func() bool { return !ready("wd-r1") }, grace/2, 100*time.Millisecond,
		"endpoints of a silent agent stay ready within the grace")
	// ...and after the grace they are withdrawn, the slice kept.
	require.Eventually(t, func() bool { return !ready("wd-r1") }, 3*grace, 100*time.Millisecond,
		"the endpoints of a stale agent are withdrawn after the grace")
	assert.True(t, ready("wd-r2"), "a live agent's endpoints are untouched")
	assert.True(t, ready("wd-r3"), "a live agent's endpoints are untouched")
	assert.InDelta(t, 1, testutil.ToFloat64(m.WithdrawnSlices), 0)

	// Stop a second agent: two of three stale is more than half, the guard holds.
	agents["wd-r2"].stop()
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.GuardHolding) == 1 }, 3*grace, 100*time.Millisecond,
		"the guard holds once two of three agents are stale")
	assert.InDelta(t, 2, testutil.ToFloat64(m.StaleAgents), 0)
	assert.True(t, ready("wd-r2"), "nothing is withdrawn while the guard holds")
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
			lease:    coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "swh-agent-n1", Annotations: map[string]string{slicemeta.AnnotationNode: "n1"}}, Spec: coordinationv1.LeaseSpec{RenewTime: &now}},
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
