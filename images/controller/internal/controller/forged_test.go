// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/audit"
)

// runningPod creates a Pod bound to nodeName with the given labels and pod IP (no kubelet in
// envtest: the status is written by the test).
func runningPod(t *testing.T, ns, name, nodeName, ip string, podLabels map[string]string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: podLabels},
		Spec:       corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "app", Image: "app"}}},
	}
	create(t, pod)
	setPodIP(t, pod, ip)
	return pod
}

func setPodIP(t *testing.T, pod *corev1.Pod, ip string) {
	t.Helper()
	pod.Status.PodIP = ip
	pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	require.NoError(t, env.Client.Status().Update(t.Context(), pod))
}

// endpointOf is an endpoint as the agent writes it: ready, serving, the Pod as its targetRef.
func endpointOf(pod *corev1.Pod, addr, nodeName string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{addr},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
		NodeName:   ptr.To(nodeName),
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
	}
}

func withEndpoints(eps ...discoveryv1.Endpoint) sliceOpt {
	return func(s *discoveryv1.EndpointSlice) { s.Endpoints = eps }
}

func auditedResource(t *testing.T, ns string) *v1alpha1.ServiceWithHealthchecks {
	t.Helper()
	swh := newResource(ns, "web", nil)
	create(t, swh)
	return eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.NotEmpty(c, swh.Status.Conditions)
	}, "the resource is reconciled")
}

func TestForgedEndpointSliceIsDeletedAndHonestOnesStay(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "forged")
	run := startController(t, ns, func(o *Options) { o.SkipAudit = false })
	swh := auditedResource(t, ns)
	nodeName := ns + "-node-a"
	node(t, nodeName)
	pod := runningPod(t, ns, "web-1", nodeName, "10.1.0.5", map[string]string{"app": "web"})
	stranger := runningPod(t, ns, "db-1", nodeName, "10.1.0.6", map[string]string{"app": "db"})

	honest := slice(t, ns, "web", swh.UID, "metrics", nodeName, withEndpoints(endpointOf(pod, "10.1.0.5", nodeName)))
	require.Eventually(t, func() bool { return testutil.ToFloat64(run.metrics.AuditedSlices) >= 1 }, wait, tick,
		"the honest slice is audited")

	// Withdrawn endpoints (ready=false, serving=false) of the node's real Pods stay: the
	// controller's own withdrawal keeps such slices for a returning agent. (Another Pod than the
	// honest slice's: an agent lists each endpoint in one slice of its port, node and family.)
	other := runningPod(t, ns, "web-2", nodeName, "10.1.0.7", map[string]string{"app": "web"})
	withdrawn := endpointOf(other, "10.1.0.7", nodeName)
	withdrawn.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false)}
	kept := slice(t, ns, "web", swh.UID, "metrics", nodeName, chunkNamed("metrics", nodeName, 7), withEndpoints(withdrawn))

	cases := []struct {
		name   string
		forged discoveryv1.Endpoint
		reason string
	}{
		{"ip", endpointOf(pod, "10.9.9.9", nodeName), "address 10.9.9.9 is not an IP of pod web-1"},
		{"ghost", endpointOf(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nobody", UID: "u"}}, "10.9.9.7", nodeName), "pod nobody does not exist"},
		{"stranger", endpointOf(stranger, "10.1.0.6", nodeName), "the resource does not select pod db-1"},
	}
	for i, tc := range cases {
		start := time.Now()
		forged := slice(t, ns, "web", swh.UID, "http", nodeName, chunkNamed("http", nodeName, 2+i),
			withEndpoints(endpointOf(pod, "10.1.0.5", nodeName), tc.forged))
		gone(t, forged, "the forged slice is deleted")
		t.Logf("forged slice %s (%s) removed %v after its write (confirmation window %v)", forged.Name, tc.reason, time.Since(start), audit.DefaultWindow)
		assert.Equal(t, float64(i+1), testutil.ToFloat64(run.metrics.ForgedSlices))
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			var notes []string
			for _, e := range eventsAbout(t, ns, "web", audit.EventForged) {
				notes = append(notes, e.Note)
			}
			found := false
			for _, n := range notes {
				found = found || (strings.Contains(n, forged.Name) && strings.Contains(n, nodeName) && strings.Contains(n, tc.reason))
			}
			assert.True(c, found, "an Event names the slice, node and endpoint: %q", notes)
		}, wait, tick)
	}

	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(honest), honest), "the honest slice stays")
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(kept), kept), "the withdrawn slice stays")
}

// fakeClock is the audit's injected clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *fakeClock) advance(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }

func TestForgedNotAPodWhoseIPChangedAndWasRepublishedWithinTheWindow(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "forged-race")
	clock := &fakeClock{now: time.Now()}
	run := startController(t, ns, func(o *Options) { o.SkipAudit = false; o.auditNow = clock.Now })
	swh := auditedResource(t, ns)
	nodeName := ns + "-node-a"
	node(t, nodeName)
	pod := runningPod(t, ns, "web-1", nodeName, "10.1.0.5", map[string]string{"app": "web"})
	s := slice(t, ns, "web", swh.UID, "http", nodeName, withEndpoints(endpointOf(pod, "10.1.0.5", nodeName)))
	audited := func() float64 { return testutil.ToFloat64(run.metrics.AuditedSlices) }
	require.Eventually(t, func() bool { return audited() >= 1 }, wait, tick, "the slice is audited")

	// The Pod's IP changes just after the agent wrote; the audit sees the mismatch (a touch of
	// the slice makes it look again).
	setPodIP(t, pod, "10.1.0.50")
	before := audited()
	update(t, s, func(s *discoveryv1.EndpointSlice) { s.Annotations["touch"] = "1" })
	require.Eventually(t, func() bool { return audited() > before }, wait, tick, "the mismatch is audited")

	// The agent republishes within the window; then the window passes.
	before = audited()
	update(t, s, func(s *discoveryv1.EndpointSlice) {
		s.Endpoints = []discoveryv1.Endpoint{endpointOf(pod, "10.1.0.50", nodeName)}
	})
	require.Eventually(t, func() bool { return audited() > before }, wait, tick, "the republished slice is audited")
	clock.advance(10 * audit.DefaultWindow)
	before = audited()
	update(t, s, func(s *discoveryv1.EndpointSlice) { s.Annotations["touch"] = "2" })
	require.Eventually(t, func() bool { return audited() > before }, wait, tick, "the slice is audited after the window")

	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(s), s), "the republished slice stays")
	assert.Zero(t, testutil.ToFloat64(run.metrics.ForgedSlices))

	// Had the agent not republished, the same mismatch is a forgery once the window has passed.
	// Which audit first sees the mismatch is not known here (the audited counter also counts the
	// audits requeued for earlier versions, so "one more audit" may come before the Pod's
	// change is seen; a run with every package beside it advanced the clock too early that way
	// and the window then started after the move). So every poll moves the clock two windows
	// on and touches the slice, which the audit then judges after the move, until the slice is
	// gone: the first audit that sees the mismatch starts its window, a later one confirms it.
	setPodIP(t, pod, "10.1.0.51")
	touches := 3
	require.Eventually(t, func() bool {
		cur := &discoveryv1.EndpointSlice{}
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(s), cur); err != nil {
			return apierrors.IsNotFound(err)
		}
		clock.advance(2 * audit.DefaultWindow)
		cur.Annotations["touch"] = fmt.Sprint(touches)
		touches++
		_ = env.Client.Update(t.Context(), cur) // A conflict or a deletion in between: the next poll sees it.
		return false
	}, wait, tick, "a mismatch that outlasts the window is a forgery")
	countsTo(t, run.metrics.ForgedSlices, 1)
}

// podReads counts the requests for Pods of one namespace that pass through a rest.Config: the
// controller has no Pod informer, so every one is an audit's read.
type podReads struct {
	prefix string
	n      atomic.Int64
}

func (p *podReads) RoundTrip(next http.RoundTripper) http.RoundTripper {
	return promhttp.RoundTripperFunc(func(req *http.Request) (*http.Response, error) {
		// The audit's metadata-only watch of Pods (LIST and WATCH as PartialObjectMetadata)
		// reads no Pod: only the audit's own reads count.
		metadataOnly := strings.Contains(req.Header.Get("Accept"), "as=PartialObjectMetadata")
		if req.Method == http.MethodGet && strings.HasPrefix(req.URL.Path, p.prefix) && !metadataOnly {
			p.n.Add(1)
		}
		return next.RoundTrip(req)
	})
}

// TestForgedAuditReadsAConstantNumberOfPods: the audit of an honest slice of N endpoints costs
// one API read (the LIST of its node's Pods), not N; a forged endpoint costs one more read (its
// Pod read again before deciding), and the slice is still deleted.
func TestForgedAuditReadsAConstantNumberOfPods(t *testing.T) {
	const n = 100
	ns := env.CreateNamespaceForTest(t, "forged-reads")
	reads := &podReads{prefix: "/api/v1/namespaces/" + ns + "/pods"}
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(reads.RoundTrip)
	nodeName := ns + "-node-a"
	node(t, nodeName)
	eps := make([]discoveryv1.Endpoint, 0, n)
	var first *corev1.Pod
	for i := range n {
		ip := fmt.Sprintf("10.2.%d.%d", i/200, i%200+1)
		pod := runningPod(t, ns, fmt.Sprintf("web-%d", i), nodeName, ip, map[string]string{"app": "web"})
		if first == nil {
			first = pod
		}
		eps = append(eps, endpointOf(pod, ip, nodeName))
	}
	// The Pods are there before the controller starts: a Pod's change brings the slices that
	// name it back to the audit, and late events of these writes would add audits to the count.
	run := startControllerOn(t, cfg, ns, func(o *Options) { o.SkipAudit = false })
	swh := auditedResource(t, ns)
	audited := func() int64 { return int64(testutil.ToFloat64(run.metrics.AuditedSlices)) }
	s := slice(t, ns, "web", swh.UID, "http", nodeName, withEndpoints(eps...))
	for i := range 5 {
		before := audited()
		update(t, s, func(s *discoveryv1.EndpointSlice) { s.Annotations["touch"] = fmt.Sprint(i) })
		require.Eventually(t, func() bool { return audited() > before }, wait, tick, "the touched slice is audited")
	}
	// Reads precede the count of an audit: once both settle, one read per audit.
	require.Eventually(t, func() bool { return reads.n.Load() == audited() && audited() >= 5 }, wait, tick,
		"one Pod read per audit of an honest %d-endpoint slice (reads %d, audits %d)", n, reads.n.Load(), audited())
	assert.Zero(t, testutil.ToFloat64(run.metrics.ForgedSlices))

	readsBefore, auditsBefore := reads.n.Load(), audited()
	update(t, s, func(s *discoveryv1.EndpointSlice) {
		s.Endpoints = append(s.Endpoints, endpointOf(first, "10.9.9.9", nodeName))
	})
	gone(t, s, "the slice with a forged endpoint is deleted")
	countsTo(t, run.metrics.ForgedSlices, 1)
	require.Eventually(t, func() bool {
		return reads.n.Load()-readsBefore == 2*(audited()-auditsBefore) && audited() > auditsBefore
	}, wait, tick, "two Pod reads per audit with one forged endpoint (reads %d, audits %d)",
		reads.n.Load()-readsBefore, audited()-auditsBefore)
}

// TestLegacySliceWithAnEndpointNamingNoNodeIsDeletedByTheAudit: a slice written before the
// node-bound rules, whose endpoint names no node, is one the agent's policy lets no agent
// update or delete (tests/cluster TestLegacySliceNoAgentMayChangeIsLeftToTheControllersAudit):
// the audit deletes it even though its endpoint names the right Pod at its address on its node,
// so no agent is left failing to update it.
func TestLegacySliceWithAnEndpointNamingNoNodeIsDeletedByTheAudit(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "legacy")
	run := startController(t, ns, func(o *Options) { o.SkipAudit = false })
	swh := auditedResource(t, ns)
	nodeName := ns + "-node-a"
	node(t, nodeName)
	pod := runningPod(t, ns, "web-1", nodeName, "10.1.0.5", map[string]string{"app": "web"})
	noNode := endpointOf(pod, "10.1.0.5", nodeName)
	noNode.NodeName = nil
	legacy := slice(t, ns, "web", swh.UID, "http", nodeName, withEndpoints(noNode), func(s *discoveryv1.EndpointSlice) {
		delete(s.Labels, wellknown.LabelNodeKey)
	})
	gone(t, legacy, "the legacy slice is deleted")
	countsTo(t, run.metrics.ForgedSlices, 1)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		found := false
		for _, e := range eventsAbout(t, ns, "web", audit.EventForged) {
			found = found || strings.Contains(e.Note, "the endpoint of pod web-1 names no node")
		}
		assert.True(c, found, "an Event says why")
	}, wait, tick)
}
