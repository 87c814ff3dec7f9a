// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// annotateDrain sets (value != nil) or removes the drain annotation of a pod with a merge patch,
// as kubectl annotate does.
func annotateDrain(t *testing.T, c *cluster.Cluster, p *cluster.Pod, value *string) {
	t.Helper()
	patch := `{"metadata":{"annotations":{"` + wellknown.AnnotationDrain + `":null}}}`
	if value != nil {
		patch = `{"metadata":{"annotations":{"` + wellknown.AnnotationDrain + `":"` + *value + `"}}}`
	}
	obj := &corev1.Pod{}
	obj.Namespace, obj.Name = p.Namespace, p.Name
	require.NoError(t, c.Env.Client.Patch(t.Context(), obj, client.RawPatch(types.MergePatchType, []byte(patch))))
}

// The drain annotation through a real API server: the annotated pod is published not ready but
// serving while its probes keep running, with a Drained Event on the resource and on the pod;
// removing it publishes the pod on its verdict again with Undrained Events. A value the agent
// cannot apply is a DrainInvalid Event on the pod that names every problem, and changes nothing.
func TestDrainAnnotationTakesAPodOutAndBack(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "drain")
	labels := map[string]string{"app": "web"}
	one := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-1", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	two := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-2", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	oneSrv := one.ServeHTTP(t, 8080)
	two.ServeHTTP(t, 8080)
	events := watchEvents(t, c, ns)
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{namedPort("http", 80, intstr.FromInt32(8080))}, httpProbe(intstr.FromInt32(8080), 1, 1))
	startAgent(t, c, "node-a")
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(one): "TTF", ip(two): "TTF"}})

	// Drained: not ready, still serving, published terminating (no new connections on any dataplane); the probes keep running.
	value := "web/http"
	annotateDrain(t, c, one, &value)
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(one): "FTT", ip(two): "TTF"}})
	hits := oneSrv.Hits()
	require.Eventually(t, func() bool { return oneSrv.Hits() >= hits+3 }, time.Minute, 50*time.Millisecond, "the drained pod is still probed")
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		onResource := events.regarding("web", agent.ReasonDrained)
		if assert.Len(ct, onResource, 1) {
			assert.Equal(ct, "web-1", onResource[0].related)
			assert.Equal(ct, "pod web-1, port http: drained by annotation network.deckhouse.io/drain: existing connections continue, new ones go to other pods", onResource[0].note)
		}
		onPod := events.regarding("web-1", agent.ReasonDrained)
		if assert.Len(ct, onPod, 1) {
			assert.Equal(ct, "web", onPod[0].related)
			assert.Equal(ct, "ServiceWithHealthchecks web, port http: drained by annotation network.deckhouse.io/drain: existing connections continue, new ones go to other pods", onPod[0].note)
		}
	}, time.Minute, 100*time.Millisecond, "the drain is an Event on the resource and on the pod")

	// A drained pod that fails stays out; passing again, it is still drained.
	oneSrv.SetHTTPStatus(503)
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(one): "FFF", ip(two): "TTF"}})
	oneSrv.SetHTTPStatus(200)
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(one): "FTT", ip(two): "TTF"}})

	// Undrained: published on its verdict again.
	annotateDrain(t, c, one, nil)
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(one): "TTF", ip(two): "TTF"}})
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.Len(ct, events.regarding("web", agent.ReasonUndrained), 1)
		onPod := events.regarding("web-1", agent.ReasonUndrained)
		if assert.Len(ct, onPod, 1) {
			assert.Equal(ct, "ServiceWithHealthchecks web, port http: the drain annotation no longer names it: published on its probe verdict again", onPod[0].note)
		}
	}, time.Minute, 100*time.Millisecond, "the undrain is an Event on the resource and on the pod")

	// A value that cannot be applied: reported on the pod, nothing drained, nothing crashed.
	bad := "web/https,ghost,Web"
	annotateDrain(t, c, two, &bad)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		w := events.regarding("web-2", agent.ReasonDrainInvalid)
		if assert.Len(ct, w, 1) {
			assert.Contains(ct, w[0].note, `annotation network.deckhouse.io/drain="web/https,ghost,Web" is not applied in part or at all: `)
			assert.Contains(ct, w[0].note, `"Web": "Web" is not a resource name`)
			assert.Contains(ct, w[0].note, `"web/https": ServiceWithHealthchecks "web" has no port "https"`)
			assert.Contains(ct, w[0].note, `"ghost": no ServiceWithHealthchecks "ghost" in the pod's namespace`)
		}
	}, time.Minute, 100*time.Millisecond, "the invalid value is an Event on the pod")
	// The agent still works: a valid drain of the other pod applies.
	all := "*"
	annotateDrain(t, c, one, &all)
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(one): "FTT", ip(two): "TTF"}})
	assert.Len(t, events.regarding("web-2", agent.ReasonDrainInvalid), 1, "the invalid value is reported once")
}
