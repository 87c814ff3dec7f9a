// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/status"
)

// renewLease renews the node Lease of node in ns every 100 ms, as an agent does, until the
// returned stop is called (or the test ends). The Lease is created when missing.
func renewLease(t *testing.T, ns, node string) (stop func()) {
	t.Helper()
	key := client.ObjectKey{Namespace: ns, Name: wellknown.AgentLeaseName(node)}
	renew := func(ctx context.Context) error {
		now := ptr.To(metav1.NewMicroTime(time.Now()))
		var l coordinationv1.Lease
		err := env.Client.Get(ctx, key, &l)
		if apierrors.IsNotFound(err) {
			return env.Client.Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name, Annotations: map[string]string{wellknown.AnnotationNode: node}},
				Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: now},
			})
		}
		if err != nil {
			return err
		}
		l.Spec.RenewTime = now
		return env.Client.Update(ctx, &l)
	}
	require.NoError(t, renew(t.Context()))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = renew(ctx) // a failed renewal is retried at the next tick, as the agent does
			}
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// gauge reads an unlabelled gauge or counter from a registry.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

func endpointReady(t *testing.T, s *discoveryv1.EndpointSlice) bool {
	t.Helper()
	var cur discoveryv1.EndpointSlice
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(s), &cur))
	return ptr.Deref(cur.Endpoints[0].Conditions.Ready, true)
}

// TestAgentsStaleFollowsTheLivenessJudgement: the AgentsStale condition of a resource follows
// the agents of the nodes it has endpoints on. Two of three agents silent at once: the guard
// holds, nothing is withdrawn and the condition says why (WithdrawalHeld, naming the nodes and
// what to check), while a resource whose nodes are all live says AgentsFresh; one agent back:
// the other one's endpoints are withdrawn (EndpointsWithdrawn); both back: AgentsFresh. Ready
// does not follow the condition.
func TestAgentsStaleFollowsTheLivenessJudgement(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "agents")
	reg := prometheus.NewRegistry()
	const grace = 4 * time.Second
	startController(t, ns, func(o *Options) {
		o.AgentLeaseNamespace = ns
		o.AgentLostGrace = grace
		o.Registry = reg
	})
	n1, n2, n3 := ns+"-n1", ns+"-n2", ns+"-n3"
	for _, n := range []string{n1, n2, n3} {
		node(t, n)
	}
	web := newResource(ns, "web", func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Ports = s.Spec.Ports[:1] })
	create(t, web)
	other := newResource(ns, "other", func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Ports = s.Spec.Ports[:1] })
	create(t, other)
	web1 := slice(t, ns, "web", web.UID, "http", n1)
	web2 := slice(t, ns, "web", web.UID, "http", n2, func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Addresses = []string{"10.2.0.5"} })
	slice(t, ns, "other", other.UID, "http", n3)
	stop1, stop2 := renewLease(t, ns, n1), renewLease(t, ns, n2)
	renewLease(t, ns, n3)

	stale := func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks, reason string) metav1.Condition {
		cond := condition(swh, v1alpha1.ConditionAgentsStale)
		want := metav1.ConditionTrue
		if reason == status.ReasonAgentsFresh {
			want = metav1.ConditionFalse
		}
		assert.Equal(c, want, cond.Status, "%s: %s", swh.Name, cond.Message)
		assert.Equal(c, reason, cond.Reason, "%s: %s", swh.Name, cond.Message)
		assert.Equal(c, metav1.ConditionTrue, condition(swh, v1alpha1.ConditionReady).Status, "%s: Ready does not follow AgentsStale", swh.Name)
		return cond
	}
	for _, swh := range []*v1alpha1.ServiceWithHealthchecks{web, other} {
		eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
			stale(c, swh, status.ReasonAgentsFresh)
		}, "with every agent renewing, no resource has stale agents")
	}
	require.Eventually(t, func() bool { return gauge(t, reg, "swh_controller_agents_known") == 3 }, wait, tick, "the controller sees the three agents")

	// Two of three agents go silent at once: more than half, the guard holds.
	stop1()
	stop2()
	var held metav1.Condition
	eventually(t, web, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		held = stale(c, swh, status.ReasonWithdrawalHeld)
	}, "the guard's condition is set on the resource with endpoints on the silent nodes")
	for _, want := range []string{"2 of 3 agents look stale", "nodes " + n1 + ", " + n2, "withdraws nothing", "API server", "in namespace " + ns} {
		assert.Contains(t, held.Message, want)
	}
	assert.Equal(t, 1.0, gauge(t, reg, "swh_controller_liveness_guard_holding"), "the guard's metric holds too")
	assert.Equal(t, 2.0, gauge(t, reg, "swh_controller_agents_stale"), "the two agents were judged stale")
	assert.True(t, endpointReady(t, web1), "nothing is withdrawn while the guard holds")
	assert.True(t, endpointReady(t, web2), "nothing is withdrawn while the guard holds")
	assert.Equal(t, 0.0, gauge(t, reg, "swh_controller_withdrawn_slices_total"))
	eventually(t, other, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		stale(c, swh, status.ReasonAgentsFresh)
	}, "a resource whose agents are live does not show the guard")

	// One agent returns: one of three is stale, the guard lets its withdrawal through.
	renewLease(t, ns, n1)
	var withdrawn metav1.Condition
	eventually(t, web, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		withdrawn = stale(c, swh, status.ReasonEndpointsWithdrawn)
	}, "the resource says its endpoints on the stale node are withdrawn")
	assert.Contains(t, withdrawn.Message, "node "+n2+" ")
	assert.NotContains(t, withdrawn.Message, n1)
	require.Eventually(t, func() bool { return !endpointReady(t, web2) }, wait, tick, "the stale node's endpoint is withdrawn")
	assert.True(t, endpointReady(t, web1))
	assert.Equal(t, 0.0, gauge(t, reg, "swh_controller_liveness_guard_holding"))

	// The other agent returns (and republishes its endpoint, as the agent does): nothing stale.
	renewLease(t, ns, n2)
	setReady(t, web2, "10.2.0.5", true)
	eventually(t, web, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		stale(c, swh, status.ReasonAgentsFresh)
	}, "the condition clears when the agents are back")
}
