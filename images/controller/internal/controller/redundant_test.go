// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/audit"
)

// redundantNodeEvents are the RedundantEndpointSlice Events about node with the action of a
// redundant slice's deletion.
func redundantNodeEvents(t *testing.T, nodeName string) []eventsv1.Event {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, env.Client.List(t.Context(), &list))
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Kind == "Node" && e.Regarding.Name == nodeName && e.Reason == audit.EventRedundant &&
			e.Action == audit.ActionDeleteRedundant {
			out = append(out, e)
		}
	}
	return out
}

// TestRedundantChunksAreDeletedAndHonestMovesStay: against a real API server, with the audit's
// clock injected, a chunk that repeats for the whole window an endpoint a lower chunk of its
// group lists (and the audit verified there) is deleted, with RedundantEndpointSlice Events on
// the resource and on the Node and the metric; the lower chunk stays and the Service keeps the
// endpoint. A forged chunk that also repeats that endpoint is removed as a forgery (Event
// ForgedEndpointSlice, the forged metric), not as a redundant slice. A chunk that lists one endpoint twice is deleted the same way (its only endpoint
// goes with it: the agent publishes its own again). Honest controls, judged after the window
// has passed in the same audit that deletes the redundant ones, stay: an endpoint the agent
// moves to a higher chunk (a split: the new chunk first, then the old one updated) and to a
// lower chunk (the lowest with room), each completed within the window; the same Pod at the
// same address and port number under another port of the resource (another group); the honest bed's IPv6 slice
// beside the IPv4 one of the same Pod, its split-port slice and its other node's slice.
func TestRedundantChunksAreDeletedAndHonestMovesStay(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "redundant")
	clock := &fakeClock{now: metav1.Now().Time}
	var log *auditLog
	run := startController(t, ns, func(o *Options) { o.SkipAudit = false; o.auditNow = clock.Now; log = newAuditLog(o) })
	b := newHonestBed(t, ns)
	for _, s := range b.slices {
		log.audited(t, s, "the honest slice is audited")
	}
	w := audit.DefaultWindow

	// Another port of the resource to the same target port: the same Pod at the same address and
	// port number, in a group of its own (only the port label differs).
	update(t, b.swh, func(swh *v1alpha1.ServiceWithHealthchecks) {
		swh.Spec.Ports = append(swh.Spec.Ports, v1alpha1.ServicePort{Name: "alt", Protocol: corev1.ProtocolTCP, Port: 8081,
			TargetPort: intstr.FromString("http")})
	})
	eventually(t, b.swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.Len(c, swh.Status.Ports, 2)
	}, "the resource's second port is reconciled")
	otherPort := slice(t, ns, "web", b.swh.UID, "alt", b.node, withEndpoints(endpointOf(b.web1, "10.5.0.1", b.node)))
	require.Equal(t, int32(8080), *otherPort.Ports[0].Port, "the same port number as the http slices of web-1")
	log.audited(t, otherPort, "the other port's slice is audited")

	// Chunks 2 and 4 hold the Pods the agent will move: m2 from chunk 2 to a new chunk 3 (a
	// split), m4 from chunk 4 to chunk 1 (the lowest chunk with room).
	sel := map[string]string{"app": "web"}
	chunk := func(k int) slicemeta.SliceKey {
		return slicemeta.SliceKey{Resource: "web", Port: "http", Node: b.node, Chunk: k}
	}
	mk := func(k int, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return slice(t, ns, "web", b.swh.UID, "http", b.node, withKey(chunk(k), 8080), withEndpoints(eps...))
	}
	m1 := podWithPorts(t, ns, "web-m1", b.node, 8080, sel, "10.5.0.21")
	m2 := podWithPorts(t, ns, "web-m2", b.node, 8080, sel, "10.5.0.22")
	m4 := podWithPorts(t, ns, "web-m4", b.node, 8080, sel, "10.5.0.24")
	m5 := podWithPorts(t, ns, "web-m5", b.node, 8080, sel, "10.5.0.25")
	twiceP := podWithPorts(t, ns, "web-d", b.node, 8080, sel, "10.5.0.30")
	e1, e2 := endpointOf(m1, "10.5.0.21", b.node), endpointOf(m2, "10.5.0.22", b.node)
	e4, e5 := endpointOf(m4, "10.5.0.24", b.node), endpointOf(m5, "10.5.0.25", b.node)
	eC := endpointOf(b.webC, "10.5.0.9", b.node)
	c2 := mk(2, e1, e2)
	c4 := mk(4, e4, e5)
	log.audited(t, c2, "chunk 2 is audited")
	log.audited(t, c4, "chunk 4 is audited")
	eventually(t, b.swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		// web-1 (both families), web-c, web-2 (split port), web-3 (long node), m1, m2, m4, m5.
		assert.Equal(c, int32(8), portStatus(swh, "http").TotalEndpoints)
	}, "the status counts each endpoint once")
	before := portStatus(b.swh, "http")

	// The window opens at t0: a chunk repeating chunk 0's web-1, a chunk listing web-d twice,
	// and the first half of both moves.
	repeat := mk(5, endpointOf(b.web1, "10.5.0.1", b.node))
	twice := mk(6, endpointOf(twiceP, "10.5.0.30", b.node), endpointOf(twiceP, "10.5.0.30", b.node))
	c3 := mk(3, e2)                                                                                             // The split's new chunk, listing m2 as chunk 2 does.
	update(t, b.slices[1], func(s *discoveryv1.EndpointSlice) { s.Endpoints = []discoveryv1.Endpoint{eC, e4} }) // m4 into chunk 1.
	// A forged chunk that also repeats chunk 0's web-1: a forgery, removed and reported as one.
	forged := mk(7, endpointOf(b.web1, "10.5.0.1", b.node), endpointOf(b.web1, "10.9.9.9", b.node))
	for _, s := range []*discoveryv1.EndpointSlice{repeat, twice, c3, b.slices[1], forged} {
		log.audited(t, s, "slice "+s.Name+" is audited")
	}
	// The group is judged with the forged chunk in it (a clean slice's audit judges its group).
	touch(t, c3, "in-window")
	log.audited(t, c3, "the split's new chunk is audited with the forged chunk in its group")
	for _, s := range []*discoveryv1.EndpointSlice{repeat, twice, c3, c2, c4, forged} {
		require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(s), &discoveryv1.EndpointSlice{}),
			"slice %s stays while the window runs (the clock stands still)", s.Name)
	}

	// Within the window the agent completes both moves: the old chunks no longer list them.
	clock.advance(w / 2)
	update(t, c2, func(s *discoveryv1.EndpointSlice) { s.Endpoints = []discoveryv1.Endpoint{e1} })
	update(t, c4, func(s *discoveryv1.EndpointSlice) { s.Endpoints = []discoveryv1.Endpoint{e5} })
	log.audited(t, c2, "chunk 2 without m2 is audited")
	log.audited(t, c4, "chunk 4 without m4 is audited")

	// The window passes; one audit of the group (chunk 3's, touched) judges it after the window:
	// the repeats go, the moved chunks stay.
	clock.advance(w/2 + w/10)
	touch(t, c3, "after-window")
	log.audited(t, c3, "the split's new chunk is audited after the window")
	gone(t, repeat, "the chunk repeating chunk 0's endpoint is deleted")
	gone(t, twice, "the chunk listing an endpoint twice is deleted")
	gone(t, forged, "the forged chunk is deleted")
	for _, s := range []*discoveryv1.EndpointSlice{c2, c3, c4, otherPort} {
		require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(s), &discoveryv1.EndpointSlice{}),
			"honest slice %s stays", s.Name)
	}
	b.kept(t)
	// And it stays when the old chunks are judged after the window too.
	touch(t, c2, "after-window")
	touch(t, c4, "after-window")
	touch(t, b.slices[1], "after-window")
	log.audited(t, c2, "chunk 2 is audited after the window")
	log.audited(t, c4, "chunk 4 is audited after the window")
	log.audited(t, b.slices[1], "chunk 1 is audited after the window")
	for _, s := range []*discoveryv1.EndpointSlice{c2, c3, c4, otherPort} {
		require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(s), &discoveryv1.EndpointSlice{}),
			"honest slice %s stays", s.Name)
	}
	b.kept(t)
	assert.Equal(t, float64(2), testutil.ToFloat64(run.metrics.RedundantSlices), "the repeat and the twice-listing chunk")
	assert.Equal(t, float64(1), testutil.ToFloat64(run.metrics.ForgedSlices), "the forged chunk, as a forgery (not as redundant)")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		found := false
		for _, e := range eventsAbout(t, ns, "web", audit.EventForged) {
			found = found || (strings.Contains(e.Note, forged.Name) && strings.Contains(e.Note, "address 10.9.9.9 is not an IP of pod web-1"))
		}
		assert.True(c, found, "the forged chunk is reported as forged")
	}, wait, tick)

	// The Events: on the resource (related: the slice) and on the Node.
	chunk0 := b.slices[0].Name
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var notes []string
		for _, e := range eventsAbout(t, ns, "web", audit.EventRedundant) {
			assert.Equal(c, audit.ActionDeleteRedundant, e.Action)
			assert.Equal(c, corev1.EventTypeWarning, e.Type)
			notes = append(notes, e.Note)
		}
		all := strings.Join(notes, "\n")
		assert.Contains(c, all, "Deleted EndpointSlice "+repeat.Name)
		assert.Contains(c, all, `endpoint 10.5.0.1 (pod "web-1") also in EndpointSlice `+chunk0)
		assert.Contains(c, all, "Deleted EndpointSlice "+twice.Name)
		assert.Contains(c, all, `endpoint 10.5.0.30 (pod "web-d") twice in this slice`)
		assert.Contains(c, all, b.node, "the Events name the node")
	}, wait, tick, "the resource has the Events")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var notes []string
		for _, e := range redundantNodeEvents(t, b.node) {
			notes = append(notes, e.Note)
		}
		all := strings.Join(notes, "\n")
		assert.Contains(c, all, ns+"/"+repeat.Name)
		assert.Contains(c, all, ns+"/"+twice.Name)
	}, wait, tick, "the Node has the Events")
	for _, e := range eventsAbout(t, ns, "web", audit.EventRedundant) {
		for _, honest := range []string{c2.Name, c3.Name, c4.Name, b.slices[1].Name, forged.Name} {
			assert.NotContains(t, e.Note, "Deleted EndpointSlice "+honest+" ", "no honest or forged chunk is reported as redundant")
		}
	}

	// The Service keeps the endpoint: chunk 0 lists web-1, once among the port's IPv4 slices of
	// the node, and the status counts what it did, without web-d (its only slice is gone).
	var list discoveryv1.EndpointSliceList
	require.NoError(t, env.Client.List(t.Context(), &list, client.InNamespace(ns),
		client.MatchingLabels{discoveryv1.LabelServiceName: "web"}))
	var web1In []string
	for _, s := range list.Items {
		port, _ := slicemeta.PortOf(&s)
		if port != "http" || s.AddressType != discoveryv1.AddressTypeIPv4 || slicemeta.NodeOf(&s) != b.node {
			continue
		}
		for _, e := range s.Endpoints {
			if e.TargetRef != nil && e.TargetRef.Name == "web-1" {
				web1In = append(web1In, s.Name)
				assert.True(t, e.Conditions.Ready != nil && *e.Conditions.Ready, "web-1 is ready in %s", s.Name)
			}
		}
	}
	assert.Equal(t, []string{chunk0}, web1In, "web-1 stays in chunk 0, once")
	eventually(t, b.swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.Equal(c, before.TotalEndpoints, portStatus(swh, "http").TotalEndpoints, "every endpoint once, as before")
		assert.Equal(c, before.ReadyEndpoints, portStatus(swh, "http").ReadyEndpoints)
	}, "the status still counts web-1, and m2 and m4 once")
}

// portStatus is the status of the resource's port named name (zero when it has none).
func portStatus(swh *v1alpha1.ServiceWithHealthchecks, name string) v1alpha1.PortStatus {
	for _, p := range swh.Status.Ports {
		if p.Name == name {
			return p
		}
	}
	return v1alpha1.PortStatus{}
}
