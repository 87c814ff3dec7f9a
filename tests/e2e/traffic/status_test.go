// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/notready"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// Issue 29 part 5, with the real programs: which pods are out of a port, and why, is in the
// resource's status (kubectl get -o yaml, kubectl describe). Of two pods serving web (HTTP
// probe) and smtp (TCP probe), one answers web's probe 503: it is listed in
// status.ports[web].notReady with the reason of the agent's PortNotReady Event, not in smtp's.
// While it stays out, a new reason (500 instead of 503) writes neither its slice nor the status:
// the reason is the one it went out with. When it answers 200 again the list empties, and at
// steady state, while the probes go on, nothing more is written.
func TestStatusNamesThePodsOutOfAPort(t *testing.T) {
	s := testStack(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "status")
	labels := map[string]string{"app": "vm"}
	a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "vm-a", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "vm-b", Node: "node-b", Labels: labels, ContainerPorts: vmPorts})
	webA := a.ServeHTTP(t, 8080)
	b.ServeHTTP(t, 8080)
	a.ServeTCP(t, 2525)
	b.ServeTCP(t, 2525)
	createResource(t, c, kit.Resource(ns, "vm", labels,
		[]v1alpha1.ServicePort{e2e.ServicePort("web", 80, intstr.FromString("web")), e2e.ServicePort("smtp", 25, intstr.FromString("smtp"))},
		kit.HTTPProbe(intstr.FromString("web")), kit.TCPProbe(intstr.FromString("smtp"))))
	all := map[string]map[string]string{
		"vm-web-node-a": {ip(a): "TTF"}, "vm-web-node-b": {ip(b): "TTF"},
		"vm-smtp-node-a": {ip(a): "TTF"}, "vm-smtp-node-b": {ip(b): "TTF"},
	}
	kit.EventuallyEndpoints(t, c, ns, "vm", all)
	key := client.ObjectKey{Namespace: ns, Name: "vm"}
	ports := func(ct require.TestingT) (v1alpha1.PortStatus, v1alpha1.PortStatus) {
		swh := &v1alpha1.ServiceWithHealthchecks{}
		require.NoError(ct, c.Env.Client.Get(t.Context(), key, swh))
		require.Len(ct, swh.Status.Ports, 2)
		return swh.Status.Ports[0], swh.Status.Ports[1]
	}
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		web, smtp := ports(ct)
		assert.Equal(ct, int32(2), web.ReadyEndpoints)
		assert.Equal(ct, int32(2), smtp.ReadyEndpoints)
	}, waitFor, poll, "both pods ready on both ports in the status")
	w := watchSlices(t, c, ns)

	webA.SetHTTPStatus(503)
	kit.EventuallyEndpoints(t, c, ns, "vm", map[string]map[string]string{
		"vm-web-node-a": {ip(a): "FFF"}, "vm-web-node-b": {ip(b): "TTF"},
		"vm-smtp-node-a": {ip(a): "TTF"}, "vm-smtp-node-b": {ip(b): "TTF"},
	})
	event := notReadyEvent(t, c, ns, "vm-a", "web")
	var listed v1alpha1.NotReadyPod
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		web, smtp := ports(ct)
		require.Len(ct, web.NotReady, 1)
		listed = web.NotReady[0]
		assert.Zero(ct, web.NotReadyOmitted)
		assert.Empty(ct, smtp.NotReady, "the pod is out of web only")
	}, waitFor, poll, "the status lists vm-a out of web")
	assert.Equal(t, v1alpha1.NotReadyPod{Pod: "vm-a", Node: "node-a", Reason: "probe 0 (HTTP): HTTP 503"}, listed)
	assert.Equal(t, "pod vm-a, port web: "+listed.Reason, event, "the status gives the reason as the Event does")
	var note string
	requireNote(t, c, ns, "vm-web-node-a", &note)
	assert.Equal(t, `{"vm-a":"probe 0 (HTTP): HTTP 503"}`, note, "the agent's note on the slice")

	// A new reason while out: the probes run and fail differently, nothing is written.
	changes, rv := len(w.Changes()), resourceVersion(t, c, key)
	webA.SetHTTPStatus(500)
	waitProbes(t, webA)
	assert.Len(t, w.Changes(), changes, "no slice written for a new reason alone: %v", w.Changes()[changes:])
	assert.Equal(t, rv, resourceVersion(t, c, key), "no status written for a new reason alone")
	_, smtp := ports(t)
	assert.Empty(t, smtp.NotReady)

	webA.SetHTTPStatus(200)
	kit.EventuallyEndpoints(t, c, ns, "vm", all)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		web, smtp := ports(ct)
		assert.Empty(ct, web.NotReady)
		assert.Empty(ct, smtp.NotReady)
		assert.Equal(ct, int32(2), web.ReadyEndpoints)
	}, waitFor, poll, "the list empties when vm-a is back")
	requireNote(t, c, ns, "vm-web-node-a", &note)
	assert.Empty(t, note, "the note goes with the last pod out")

	// Steady state: the probes go on, nothing is written.
	changes, rv = len(w.Changes()), resourceVersion(t, c, key)
	waitProbes(t, webA)
	assert.Len(t, w.Changes(), changes, "no slice written at steady state: %v", w.Changes()[changes:])
	assert.Equal(t, rv, resourceVersion(t, c, key), "no status written at steady state")
}

// waitProbes waits until the agent has probed the server three more times (one probe a second).
func waitProbes(t *testing.T, srv *cluster.Server) {
	t.Helper()
	hits := srv.Hits()
	require.Eventually(t, func() bool { return srv.Hits() >= hits+3 }, waitFor, poll, "the agent keeps probing %s", srv.Addr())
}

func resourceVersion(t *testing.T, c *cluster.Cluster, key client.ObjectKey) string {
	t.Helper()
	swh := &v1alpha1.ServiceWithHealthchecks{}
	require.NoError(t, c.Env.Client.Get(t.Context(), key, swh))
	return swh.ResourceVersion
}

// requireNote reads the note (api/notready) of a slice into note ("" when it has none).
func requireNote(t *testing.T, c *cluster.Cluster, ns, name string, note *string) {
	t.Helper()
	_, slices, err := e2e.SlicesOf(t.Context(), c, ns, "vm")
	require.NoError(t, err)
	s, ok := slices[name]
	require.True(t, ok, "slice %s", name)
	*note = s.Annotations[notready.Annotation]
}

// notReadyEvent waits for the agent's PortNotReady Event of the pod's port and returns its note.
func notReadyEvent(t *testing.T, c *cluster.Cluster, ns, pod, port string) string {
	t.Helper()
	var note string
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		var list eventsv1.EventList
		require.NoError(ct, c.Env.Client.List(t.Context(), &list, client.InNamespace(ns)))
		for _, e := range list.Items {
			if e.Reason == "PortNotReady" && strings.HasPrefix(e.Note, "pod "+pod+", port "+port+": ") {
				note = e.Note
			}
		}
		assert.NotEmpty(ct, note)
	}, waitFor, poll, "the PortNotReady Event of %s, port %s", pod, port)
	return note
}
