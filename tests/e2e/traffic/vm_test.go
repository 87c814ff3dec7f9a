// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// Scenario 3: the VM pod. One pod serves HTTP (port web) and SMTP (port smtp); one resource
// has a probe per port. When SMTP stops, the smtp port withdraws the pod — its slice says so,
// kube-proxy stops routing to it and SMTP requests through the ClusterIP fail — while web
// requests through the same ClusterIP to the same pod go on with zero failures, across the
// outage and the recovery.
//
// The same scenario runs on Cilium (TestCiliumTheVMPodKeepsItsWebTrafficWhenSMTPStops).
func TestTheVMPodKeepsItsWebTrafficWhenSMTPStops(t *testing.T) {
	vmPodKeepsItsWebTraffic(t, testStack(t))
}

// vmPodKeepsItsWebTraffic is scenario 3 on the stack's dataplane.
func vmPodKeepsItsWebTraffic(t *testing.T, s *stack.Stack) {
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "vm")
	labels := map[string]string{"vm": "mail-1"}
	vm := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "vm-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	web := vm.ServeHTTP(t, 8080)
	smtp := vm.ServeSMTP(t, 2525)
	createResource(t, c, kit.Resource(ns, "mail", labels,
		[]v1alpha1.ServicePort{e2e.ServicePort("web", 80, intstr.FromString("web")), e2e.ServicePort("smtp", 25, intstr.FromInt32(2525))},
		kit.HTTPProbe(intstr.FromInt32(8080)), kit.TCPProbe(intstr.FromString("smtp"))))
	kit.EventuallyEndpoints(t, c, ns, "mail", map[string]map[string]string{
		"mail-web-node-a":  {ip(vm): "TTF"},
		"mail-smtp-node-a": {ip(vm): "TTF"},
	})
	c.WaitProgrammed(t, ns+"/mail", 80, vm)
	c.WaitProgrammed(t, ns+"/mail", 25, vm)
	before := c.Requests(t, cluster.TrafficOptions{Service: ns + "/mail", Port: 25, Protocol: cluster.SMTP, Count: 10})
	require.Equal(t, map[string]int{vm.Key(): 10}, before.ByPod(), "SMTP through the ClusterIP works before the outage: %s", before)
	w := watchSlices(t, c, ns)

	loop := c.Traffic(t, cluster.TrafficOptions{Service: ns + "/mail", Port: 80, Duration: loopFor})
	logTimelineOnFailure(t, w, loop)
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)
	stopped := time.Now()
	smtp.Stop()
	kit.EventuallyEndpoints(t, c, ns, "mail", map[string]map[string]string{
		"mail-web-node-a":  {ip(vm): "TTF"},
		"mail-smtp-node-a": {ip(vm): "FFF"},
	})
	c.WaitProgrammed(t, ns+"/mail", 25)
	withdrawn := time.Now()
	during := c.Requests(t, cluster.TrafficOptions{Service: ns + "/mail", Port: 25, Protocol: cluster.SMTP, Count: 10})
	assert.Zero(t, during.OK(), "SMTP through the ClusterIP has no endpoint while the pod is withdrawn: %s", during)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		swh := &v1alpha1.ServiceWithHealthchecks{}
		require.NoError(ct, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "mail"}, swh))
		cond := meta.FindStatusCondition(swh.Status.Conditions, v1alpha1.ConditionEndpointsAvailable)
		require.NotNil(ct, cond)
		assert.Equal(ct, "no ready endpoint for port smtp", cond.Message)
	}, waitFor, poll, "the controller reports the withdrawn port")
	kit.WaitRequestsAfter(t, loop, withdrawn, minInWindow)

	require.NoError(t, smtp.Start())
	kit.EventuallyEndpoints(t, c, ns, "mail", map[string]map[string]string{
		"mail-web-node-a":  {ip(vm): "TTF"},
		"mail-smtp-node-a": {ip(vm): "TTF"},
	})
	c.WaitProgrammed(t, ns+"/mail", 25, vm)
	back := time.Now()
	kit.WaitRequestsAfter(t, loop, back, minInWindow)
	res := loop.Stop()

	outage := kit.RequireWindow(t, res, "from SMTP stopped to SMTP back", stopped, back)
	assert.Empty(t, res.Failed(), "web requests to the VM while its SMTP failed: %s; failed: %s", res, e2e.Failures(res))
	assert.Equal(t, map[string]int{vm.Key(): len(outage)}, outage.ByPod(), "the VM answered every web request of the outage")
	assert.Equal(t, []string{
		"mail-smtp-node-a: " + ip(vm) + " TTF -> FFF",
		"mail-smtp-node-a: " + ip(vm) + " FFF -> TTF",
	}, w.ConditionChanges(), "only the smtp port changed, once each way")
	assert.Positive(t, web.Hits(), "the web server was reached")
	t.Logf("scenario 3: %d web requests during the SMTP outage window (%s), %d failed; %d in the whole loop",
		len(outage), back.Sub(stopped).Round(time.Millisecond), len(outage.Failed()), len(res))
	record(t, "3 VM pod: SMTP stops, web goes on", res, outage)
}
