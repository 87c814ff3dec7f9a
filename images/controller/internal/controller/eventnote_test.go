// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/audit"
	"github.com/deckhouse/service-with-healthchecks/lib/eventnote"
)

// TestExhaustAForgedSliceOfManyEndpointsStillGetsItsEvent: a forged slice whose 60 endpoints
// name Pods that do not exist, under 200-character names, makes a ForgedEndpointSlice note of
// about 20 KB, which the events API refuses (1 KiB at most): the Event meant to name the node
// was lost. The controller's recorder caps every note, so the Event is recorded, names the
// slice and the node, and is at most 1 KiB. Positive control: the honest slice of the same
// port and node stays.
func TestExhaustAForgedSliceOfManyEndpointsStillGetsItsEvent(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "forged-many")
	startController(t, ns, func(o *Options) { o.SkipAudit = false })
	swh := auditedResource(t, ns)
	nodeName := ns + "-node-a"
	node(t, nodeName)
	pod := runningPod(t, ns, "web-1", nodeName, "10.1.0.5", map[string]string{"app": "web"})
	honest := slice(t, ns, "web", swh.UID, "http", nodeName, withEndpoints(endpointOf(pod, "10.1.0.5", nodeName)))

	var forgedEndpoints []discoveryv1.Endpoint
	for i := range 60 {
		ghost := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("ghost-%02d-%s", i, strings.Repeat("g", 190)), UID: types.UID(fmt.Sprintf("uid-%d", i))}}
		forgedEndpoints = append(forgedEndpoints, endpointOf(ghost, fmt.Sprintf("10.9.0.%d", i+1), nodeName))
	}
	forged := slice(t, ns, "web", swh.UID, "http", nodeName, chunkNamed("http", nodeName, 2), withEndpoints(forgedEndpoints...))
	gone(t, forged, "the forged slice is deleted")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		events := eventsAbout(t, ns, "web", audit.EventForged)
		if assert.NotEmpty(c, events, "the Event of the forged slice is recorded") {
			note := events[0].Note
			assert.LessOrEqual(c, len(note), eventnote.MaxBytes)
			assert.Contains(c, note, "Deleted EndpointSlice "+forged.Name+" published for node \""+nodeName+"\"")
		}
	}, wait, tick)
	var kept discoveryv1.EndpointSlice
	assert.NoError(t, env.Client.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: honest.Name}, &kept), "the honest slice stays")
}
