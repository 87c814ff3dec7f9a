// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/probebudget"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// Issue 28, part 5: a per-node probe budget. The agent of node-a may keep 2 targets. Namespace
// hog asks for 3 (three pods, one probe each), namespace victim for 1: the fair shares are 1
// and 1. The victim's target is probed and its port published serving; of the hog's, only the
// first pod by name is probed, the other two are not probed at all and their ports are
// published not serving. The agent reports the hog on its Lease with the numbers, and the
// real controller shows them in the hog's ProbeBudgetExceeded condition.
func TestBudgetOverBudgetNamespaceIsReportedAndTheVictimIsServed(t *testing.T) {
	c := testCluster(t)
	hog := c.Env.CreateNamespaceForTest(t, "hog")
	victim := c.Env.CreateNamespaceForTest(t, "victim")
	leaseNS := c.Env.CreateNamespaceForTest(t, "leases")
	ports := []v1alpha1.ServicePort{namedPort("web", 80, intstr.FromInt32(8080))}
	probe := httpProbe(intstr.FromInt32(8080), 1, 3)

	hogLabels := map[string]string{"app": "hog"}
	hogPods := make([]*cluster.Pod, 3)
	hogServers := make([]*cluster.Server, 3)
	for i := range hogPods {
		hogPods[i] = c.AddPod(t, cluster.PodSpec{Namespace: hog, Name: fmt.Sprintf("hog-%d", i), Node: "node-a", Labels: hogLabels, ContainerPorts: vmPorts})
		hogServers[i] = hogPods[i].ServeHTTP(t, 8080)
	}
	createResource(t, c, hog, "hog", hogLabels, ports, probe)
	victimLabels := map[string]string{"app": "victim"}
	vp := c.AddPod(t, cluster.PodSpec{Namespace: victim, Name: "victim-0", Node: "node-a", Labels: victimLabels, ContainerPorts: vmPorts})
	vs := vp.ServeHTTP(t, 8080)
	createResource(t, c, victim, "victim", victimLabels, ports, probe)

	startController(t, c, leaseNS)
	a := startAgent(t, c, "node-a", withLease(t, c, leaseNS, "node-a"), func(o *agent.Options) { o.MaxProbeTargets = 2 })

	// The victim is probed and served; the hog's first pod too, its two others published not
	// serving.
	eventuallySlices(t, c, victim, "victim", map[string]map[string]string{"victim-web-node-a": {ip(vp): "TTF"}})
	eventuallySlices(t, c, hog, "hog", map[string]map[string]string{"hog-web-node-a": {
		ip(hogPods[0]): "TTF", ip(hogPods[1]): "FFF", ip(hogPods[2]): "FFF",
	}})
	assert.Equal(t, 2, a.Scheduler.Len(), "the scheduler keeps the budget's 2 targets")
	assert.InDelta(t, 2.0, testutil.ToFloat64(a.Metrics.TargetsOverBudget), 0, "2 targets over budget")
	assert.InDelta(t, 2.0, testutil.ToFloat64(a.Metrics.ProbeBudget), 0)

	// The agent's Lease names the hog with its numbers, and not the victim.
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		var l coordinationv1.Lease
		require.NoError(ct, c.Env.Client.Get(t.Context(), types.NamespacedName{Namespace: leaseNS, Name: wellknown.AgentLeaseName("node-a")}, &l))
		note, err := probebudget.Parse(l.Annotations[probebudget.Annotation])
		require.NoError(ct, err)
		assert.Equal(ct, probebudget.Note{Budget: 2, Over: []probebudget.Resource{{Namespace: hog, Name: "hog", Asked: 3, Allowed: 1}}}, note)
	}, time.Minute, 100*time.Millisecond, "the agent reports the hog over budget on its Lease")

	// The controller shows it on the hog, with the numbers, and not on the victim.
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		var swh v1alpha1.ServiceWithHealthchecks
		require.NoError(ct, c.Env.Client.Get(t.Context(), types.NamespacedName{Namespace: hog, Name: "hog"}, &swh))
		cond := meta.FindStatusCondition(swh.Status.Conditions, v1alpha1.ConditionProbeBudgetExceeded)
		require.NotNil(ct, cond)
		assert.Equal(ct, "True", string(cond.Status))
		assert.Contains(ct, cond.Message, "2 of 3 probe targets")
		assert.Contains(ct, cond.Message, "node node-a: 1 of 3 probed (budget 2 per node)")
	}, time.Minute, 100*time.Millisecond, "the hog has ProbeBudgetExceeded with its numbers")
	var v v1alpha1.ServiceWithHealthchecks
	require.NoError(t, c.Env.Client.Get(t.Context(), types.NamespacedName{Namespace: victim, Name: "victim"}, &v))
	assert.Nil(t, meta.FindStatusCondition(v.Status.Conditions, v1alpha1.ConditionProbeBudgetExceeded), "the victim is within budget")

	// The targets over budget are not probed: while the in-budget ones are probed three more
	// times each, the hog's second and third pods see no request. (Before the victim's resource
	// was first reconciled the hog alone could hold the whole budget: hits before are allowed.)
	over := []int64{hogServers[1].Hits(), hogServers[2].Hits()}
	before, hog0 := vs.Hits(), hogServers[0].Hits()
	require.Eventually(t, func() bool { return vs.Hits() >= before+3 && hogServers[0].Hits() >= hog0+3 }, time.Minute, 50*time.Millisecond,
		"the victim's and the hog's in-budget targets keep being probed")
	assert.Equal(t, over, []int64{hogServers[1].Hits(), hogServers[2].Hits()}, "hog-1 and hog-2 are over budget: not probed")
}
