// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// A drain Event on a pod whose note differs from an earlier one of the same pod, resource and
// reason (another port drained; another invalid value) is an Event of its own, with its own
// note: the action names what the notes differ in (Drain/<ports>, Drain/invalid/<digest>).
// With the fixed action "Drain", client-go's broadcaster merged the second into a series of the
// first, whose note names the first port or value, and the second was in no Event.
func TestADifferentDrainNoteIsAnEventOfItsOwn(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "drain-keys")
	labels := map[string]string{"app": "web"}
	pod := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-1", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	pod.ServeHTTP(t, 8080)
	pod.ServeHTTP(t, 8081)
	other := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-2", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	other.ServeHTTP(t, 8080)
	other.ServeHTTP(t, 8081)
	events := watchEvents(t, c, ns)
	createResource(t, c, ns, "web", labels, []v1alpha1.ServicePort{
		namedPort("http", 80, intstr.FromInt32(8080)), namedPort("metrics", 81, intstr.FromInt32(8081)),
	}, httpProbe(intstr.FromInt32(8080), 1, 1), httpProbe(intstr.FromInt32(8081), 1, 1))
	startAgent(t, c, "node-a")
	eventuallySlices(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-a":    {ip(pod): "TTF", ip(other): "TTF"},
		"web-metrics-node-a": {ip(pod): "TTF", ip(other): "TTF"},
	})

	notesOf := func(regarding, reason string) map[string]string {
		names := map[string]string{}
		for _, e := range events.regarding(regarding, reason) {
			names[e.name] = e.note
		}
		return names
	}
	first := "web/http"
	annotateDrain(t, c, pod, &first)
	assert.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.Len(ct, notesOf("web-1", agent.ReasonDrained), 1)
	}, time.Minute, 100*time.Millisecond, "the first port's drain Event on the pod")
	second := "web/http,web/metrics"
	annotateDrain(t, c, pod, &second)
	assert.EventuallyWithT(t, func(ct *assert.CollectT) {
		notes := notesOf("web-1", agent.ReasonDrained)
		assert.Len(ct, notes, 2, "two Events: %v", notes)
		var all []string
		for _, n := range notes {
			all = append(all, n)
		}
		assert.Contains(ct, strings.Join(all, "\n"), "ServiceWithHealthchecks web, port http: drained by annotation")
		assert.Contains(ct, strings.Join(all, "\n"), "ServiceWithHealthchecks web, port metrics: drained by annotation")
	}, time.Minute, 100*time.Millisecond, "the second port's drain is an Event of its own, with its note")

	bad1, bad2 := "ghost", "web/https"
	annotateDrain(t, c, other, &bad1)
	assert.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.Len(ct, notesOf("web-2", agent.ReasonDrainInvalid), 1)
	}, time.Minute, 100*time.Millisecond, "the first invalid value's Event")
	annotateDrain(t, c, other, &bad2)
	assert.EventuallyWithT(t, func(ct *assert.CollectT) {
		notes := notesOf("web-2", agent.ReasonDrainInvalid)
		assert.Len(ct, notes, 2, "two Events: %v", notes)
		var all []string
		for _, n := range notes {
			all = append(all, n)
		}
		assert.Contains(ct, strings.Join(all, "\n"), `"ghost": no ServiceWithHealthchecks "ghost"`)
		assert.Contains(ct, strings.Join(all, "\n"), `"web/https": ServiceWithHealthchecks "web" has no port "https"`)
	}, time.Minute, 100*time.Millisecond, "the second invalid value is an Event of its own, with its note")
}
