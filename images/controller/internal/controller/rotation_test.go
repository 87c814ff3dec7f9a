// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/audit"
)

// honestBed is a node with an honest agent's slices of every shape: the common name, a chunk,
// IPv6, a split port, and a second node whose name is long enough for the digest form. Every
// test of this file keeps them as its positive control.
type honestBed struct {
	ns, node, longNode string
	swh                *v1alpha1.ServiceWithHealthchecks
	web1, web2, web3   *corev1.Pod
	// webC is the Pod of the chunk: an agent lists each endpoint in one slice of its group.
	webC   *corev1.Pod
	slices []*discoveryv1.EndpointSlice
}

// podWithPorts creates a Pod bound to nodeName with container port "http" = httpPort and the
// given addresses (the first IPv4, an optional second IPv6).
func podWithPorts(t *testing.T, ns, name, nodeName string, httpPort int32, labels map[string]string, ips ...string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "app", Image: "app",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: httpPort}}}}},
	}
	create(t, pod)
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP = ips[0]
	for _, ip := range ips {
		pod.Status.PodIPs = append(pod.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	require.NoError(t, env.Client.Status().Update(t.Context(), pod))
	return pod
}

// withKey names the slice after key and sets its family and port number.
func withKey(key slicemeta.SliceKey, number int32) sliceOpt {
	return func(s *discoveryv1.EndpointSlice) {
		s.Name = key.Name()
		if key.AddressType != "" {
			s.AddressType = key.AddressType
		}
		s.Ports[0].Port = ptr.To(number)
	}
}

// newHonestBed creates the resource web (port http, target port named "http") and the honest
// slices; the controller must be started before (its audit judges them as they come).
func newHonestBed(t *testing.T, ns string) *honestBed {
	t.Helper()
	b := &honestBed{ns: ns, node: ns + "-node-a"}
	// A node name only the digest fits in a slice name: 250 characters in labels of at most 60.
	b.longNode = ns + "-node-long"
	for len(b.longNode) < 250 {
		b.longNode = strings.Repeat("l", min(60, 250-len(b.longNode)-1)) + "." + b.longNode
	}
	node(t, b.node)
	node(t, b.longNode)
	b.swh = newResource(ns, "web", func(s *v1alpha1.ServiceWithHealthchecks) {
		s.Spec.Ports = []v1alpha1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http")}}
	})
	create(t, b.swh)
	eventually(t, b.swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.NotEmpty(c, swh.Status.Conditions)
	}, "the resource is reconciled")
	sel := map[string]string{"app": "web"}
	b.web1 = podWithPorts(t, ns, "web-1", b.node, 8080, sel, "10.5.0.1", "fd00:5::1")
	b.web2 = podWithPorts(t, ns, "web-2", b.node, 8081, sel, "10.5.0.2")
	b.web3 = podWithPorts(t, ns, "web-3", b.longNode, 8080, sel, "10.5.0.3")
	b.webC = podWithPorts(t, ns, "web-c", b.node, 8080, sel, "10.5.0.9")
	key := slicemeta.SliceKey{Resource: "web", Port: "http", Node: b.node}
	chunk, v6, split, long := key, key, key, key
	chunk.Chunk = 1
	v6.AddressType = discoveryv1.AddressTypeIPv6
	split.SplitPort = 8081
	long.Node = b.longNode
	require.NotContains(t, long.Name(), b.longNode, "the long node's slice carries the digest")
	mk := func(k slicemeta.SliceKey, number int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return slice(t, ns, "web", b.swh.UID, "http", k.Node, withKey(k, number), withEndpoints(eps...))
	}
	b.slices = []*discoveryv1.EndpointSlice{
		mk(key, 8080, endpointOf(b.web1, "10.5.0.1", b.node)),
		mk(chunk, 8080, endpointOf(b.webC, "10.5.0.9", b.node)),
		mk(v6, 8080, endpointOf(b.web1, "fd00:5::1", b.node)),
		mk(split, 8081, endpointOf(b.web2, "10.5.0.2", b.node)),
		mk(long, 8080, endpointOf(b.web3, "10.5.0.3", b.longNode)),
	}
	return b
}

// kept checks that every honest slice is still there.
func (b *honestBed) kept(t *testing.T) {
	t.Helper()
	for _, s := range b.slices {
		require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(s), &discoveryv1.EndpointSlice{}), "honest slice %s stays", s.Name)
	}
}

// forgedSlice writes, as node b.node's agent would, a slice of resource web with the given
// endpoints under the name its agent gives chunk k of port http (k above the honest bed's
// chunks): a name no agent of the node gives is garbage (gc.NameNotItsNode) before the audit
// sees it.
func (b *honestBed) forgedSlice(t *testing.T, k int, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	t.Helper()
	return slice(t, b.ns, "web", b.swh.UID, "http", b.node, chunkNamed("http", b.node, k), withEndpoints(eps...))
}

// nodeEvents are the Events about node (cluster-scoped: any namespace) with the given action.
func nodeEvents(t *testing.T, nodeName, action string) []eventsv1.Event {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, env.Client.List(t.Context(), &list))
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Kind == "Node" && e.Regarding.Name == nodeName && e.Reason == audit.EventForged && (action == "" || e.Action == action) {
			out = append(out, e)
		}
	}
	return out
}

// auditLog records each audit's slice and version (Options.onAudit).
type auditLog struct {
	mu    sync.Mutex
	seen  map[types.NamespacedName]map[string]bool
	times map[types.NamespacedName]int
}

func newAuditLog(o *Options) *auditLog {
	l := &auditLog{seen: map[types.NamespacedName]map[string]bool{}, times: map[types.NamespacedName]int{}}
	o.onAudit = func(name types.NamespacedName, rv string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.seen[name] == nil {
			l.seen[name] = map[string]bool{}
		}
		l.seen[name][rv] = true
		l.times[name]++
	}
	return l
}

// count is how many audits the slice named key had.
func (l *auditLog) count(key types.NamespacedName) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.times[key]
}

// audited waits until the audit has judged s at its resourceVersion.
func (l *auditLog) audited(t *testing.T, s *discoveryv1.EndpointSlice, msg string) {
	t.Helper()
	key := client.ObjectKeyFromObject(s)
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.seen[key][s.ResourceVersion]
	}, wait, tick, msg)
}

// TestRotatedForgeryIsConfirmedAndItsRepeatsAreDeletedAtOnce: the confirmation window belongs
// to the node and the forged endpoint, not to the slice. A forger that deletes its slice before
// the window closes and writes the same endpoint under another name is confirmed when the
// window has passed since it first appeared (on the injected clock: under the window of one
// slice UID the second name would wait a window of its own); two names alternating too. Once
// confirmed, the forgery is remembered for the node: a later slice that repeats it is deleted
// with the clock frozen (no new window), the Node gets an Event, the node's gauge counts it.
// Positive controls: the honest slices of every shape stay, and an honest agent whose Pod
// changed IP republishes within the window and is not taken for a forger.
func TestRotatedForgeryIsConfirmedAndItsRepeatsAreDeletedAtOnce(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "rotation")
	clock := &fakeClock{now: metav1.Now().Time}
	var log *auditLog
	run := startController(t, ns, func(o *Options) { o.SkipAudit = false; o.auditNow = clock.Now; log = newAuditLog(o) })
	b := newHonestBed(t, ns)
	for _, s := range b.slices {
		log.audited(t, s, "the honest slice is audited")
	}
	forged := endpointOf(b.web1, "10.9.9.9", b.node)
	w := audit.DefaultWindow

	// Rotation: the same forged endpoint under a second name before the window closes.
	x1 := b.forgedSlice(t, 11, forged)
	log.audited(t, x1, "the first name is audited")
	clock.advance(w * 6 / 10)
	require.NoError(t, env.Client.Delete(t.Context(), x1))
	x2 := b.forgedSlice(t, 12, forged)
	log.audited(t, x2, "the second name is audited")
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(x2), x2), "the window has not passed yet")
	clock.advance(w * 6 / 10) // 1.2 windows since the endpoint first appeared, 0.6 since x2 did.
	update(t, x2, func(s *discoveryv1.EndpointSlice) { s.Annotations["touch"] = "1" })
	gone(t, x2, "the rotated forgery is confirmed a window after it first appeared")
	countsTo(t, run.metrics.ForgedSlices, 1)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.NotEmpty(c, nodeEvents(t, b.node, "ConfirmForgery"), "the Node has an Event")
	}, wait, tick)
	assert.Equal(t, float64(1), testutil.ToFloat64(run.metrics.NodeForgeries.WithLabelValues(b.node)), "the node's gauge counts the forgery")

	// The clock stands still from here: only a remembered forgery can be deleted.
	x3 := b.forgedSlice(t, 13, forged)
	gone(t, x3, "a repeat under a third name is deleted at once")
	sameAddr := endpointOf(b.web2, "10.9.9.9", b.node) // The same address under another Pod.
	x4 := b.forgedSlice(t, 14, endpointOf(b.web1, "10.5.0.1", b.node), sameAddr)
	gone(t, x4, "the same forged address under another Pod is deleted at once")
	countsTo(t, run.metrics.ForgedSlices, 3)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.NotEmpty(c, nodeEvents(t, b.node, "DeleteRepeatedForgery"), "the repeats are reported on the Node")
	}, wait, tick)
	fresh := b.forgedSlice(t, 15, endpointOf(b.web1, "10.9.9.10", b.node))
	log.audited(t, fresh, "a fresh forgery is audited")

	// Two names alternating, with another address: y1, y2, y1 again (a new object).
	other := endpointOf(b.web1, "10.9.9.11", b.node)
	var y *discoveryv1.EndpointSlice
	for i, k := range []int{16, 17, 16} {
		if y != nil {
			require.NoError(t, env.Client.Delete(t.Context(), y))
		}
		y = b.forgedSlice(t, k, other)
		log.audited(t, y, "chunk "+strconv.Itoa(k)+" is audited")
		if i < 2 {
			clock.advance(w * 4 / 10)
		}
	}
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(y), y), "0.8 windows: not yet")
	clock.advance(w * 3 / 10)
	update(t, y, func(s *discoveryv1.EndpointSlice) { s.Annotations["touch"] = "1" })
	gone(t, y, "two names alternating are confirmed a window after the endpoint first appeared")
	gone(t, fresh, "the fresh forgery is confirmed once its own window has passed")

	// Positive control: web-2's IP changes; its agent republishes within the window.
	split := b.slices[3]
	before := log.count(client.ObjectKeyFromObject(split))
	b.web2.Status.PodIP, b.web2.Status.PodIPs = "10.5.0.22", []corev1.PodIP{{IP: "10.5.0.22"}}
	require.NoError(t, env.Client.Status().Update(t.Context(), b.web2))
	require.Eventually(t, func() bool { return log.count(client.ObjectKeyFromObject(split)) > before }, wait, tick,
		"the Pod's change brings its slice back to the audit")
	clock.advance(w / 5)
	update(t, split, func(s *discoveryv1.EndpointSlice) {
		s.Endpoints = []discoveryv1.Endpoint{endpointOf(b.web2, "10.5.0.22", b.node)}
	})
	log.audited(t, split, "the republished slice is audited")
	clock.advance(10 * w)
	update(t, split, func(s *discoveryv1.EndpointSlice) { s.Annotations["touch"] = "1" })
	log.audited(t, split, "the slice is audited after the window")
	b.kept(t)
	assert.Equal(t, float64(5), testutil.ToFloat64(run.metrics.ForgedSlices), "x2, x3, x4, y and the fresh one; nothing honest")
}

// staleReader answers every read of an EndpointSlice with the resourceVersion it first saw
// for that object: a cache that always lags behind a slice rewritten again and again.
type staleReader struct {
	client.Reader
	mu    sync.Mutex
	first map[types.UID]string
}

func (r *staleReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := r.Reader.Get(ctx, key, obj, opts...); err != nil {
		return err
	}
	if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
		r.mu.Lock()
		defer r.mu.Unlock()
		if rv, seen := r.first[s.UID]; seen {
			s.ResourceVersion = rv
		} else {
			r.first[s.UID] = s.ResourceVersion
		}
	}
	return nil
}

// TestChurnedForgeryIsDeletedThoughItIsRewrittenAllTheTime: a forger rewrites an annotation of
// its slice over and over, and the audit's reads are always behind (staleReader): every delete
// at the version read conflicts. The audit reads the latest version again, finds it still
// forged and deletes it with a UID precondition only. Positive control: the honest slices stay.
func TestChurnedForgeryIsDeletedThoughItIsRewrittenAllTheTime(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "churn")
	stale := &staleReader{first: map[types.UID]string{}}
	run := startController(t, ns, func(o *Options) {
		o.SkipAudit = false
		o.auditReader = func(r client.Reader) client.Reader { stale.Reader = r; return stale }
	})
	b := newHonestBed(t, ns)
	churned := b.forgedSlice(t, 18, endpointOf(b.web1, "10.5.0.1", b.node), endpointOf(b.web1, "10.9.9.9", b.node))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	writes := make(chan int, 1)
	go func() {
		n := 0
		defer func() { writes <- n }()
		for i := 0; ctx.Err() == nil; i++ {
			var s discoveryv1.EndpointSlice
			if env.Client.Get(ctx, client.ObjectKeyFromObject(churned), &s) != nil {
				return // Gone.
			}
			s.Annotations["churn"] = fmt.Sprint(i)
			if env.Client.Update(ctx, &s) == nil {
				n++
			}
		}
	}()
	gone(t, churned, "the churned forgery is deleted")
	cancel()
	t.Logf("the forger rewrote its slice %d times before it was deleted", <-writes)
	countsTo(t, run.metrics.ForgedSlices, 1)
	b.kept(t)
}

// ghosts are n not-ready endpoints naming Pods of the namespace that do not exist, whose names
// sort before every real Pod's.
func ghosts(n int, nodeName string) []discoveryv1.Endpoint {
	out := make([]discoveryv1.Endpoint, 0, n)
	for i := range n {
		e := endpointOf(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: fmt.Sprintf("aaa-ghost-%04d", i), UID: types.UID(fmt.Sprint(i))}},
			fmt.Sprintf("10.8.%d.%d", i/250, i%250+1), nodeName)
		e.TargetRef.Namespace = ""
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
		out = append(out, e)
	}
	return out
}

// TestExhaustingSlicesAreRemovedAndNeverCounted: what no agent plan produces is removed, with an
// Event naming the node, and is never counted in the status: a chunk of 1,000 not-ready endpoints
// naming Pods that do not exist (which pushed the real failing Pod out of notReady and cost one
// Pod read per name), and an empty chunk. The audit of the 1,000-name slice costs at most 1 +
// audit.MaxRereads Pod reads. While its window runs (the clock stands still), the status counts
// only the honest endpoints and lists the real failing Pod. Positive control: the honest slices
// of every shape stay.
func TestExhaustingSlicesAreRemovedAndNeverCounted(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "exhaust")
	clock := &fakeClock{now: metav1.Now().Time}
	reads := &podReads{prefix: "/api/v1/namespaces/" + ns + "/pods"}
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(reads.RoundTrip)
	var log *auditLog
	run := startControllerOn(t, cfg, ns, func(o *Options) { o.SkipAudit = false; o.auditNow = clock.Now; log = newAuditLog(o) })
	b := newHonestBed(t, ns)
	// A real failing Pod, published not ready in the common slice.
	failing := podWithPorts(t, ns, "web-4", b.node, 8080, map[string]string{"app": "web"}, "10.5.0.4")
	down := endpointOf(failing, "10.5.0.4", b.node)
	down.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
	update(t, b.slices[0], func(s *discoveryv1.EndpointSlice) { s.Endpoints = append(s.Endpoints, down) })
	for _, s := range b.slices {
		log.audited(t, s, "the honest slice is audited")
	}
	honest := eventually(t, b.swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		if assert.Len(c, swh.Status.Ports, 1) {
			assert.Len(c, swh.Status.Ports[0].NotReady, 1)
		}
	}, "the status lists the failing Pod")
	total := honest.Status.Ports[0].TotalEndpoints

	readsBefore := reads.n.Load()
	key := slicemeta.SliceKey{Resource: "web", Port: "http", Node: b.node, Chunk: 7}
	flood := slice(t, ns, "web", b.swh.UID, "http", b.node, withKey(key, 8080), withEndpoints(ghosts(1000, b.node)...))
	log.audited(t, flood, "the flood is audited")
	key.Chunk = 8
	empty := slice(t, ns, "web", b.swh.UID, "http", b.node, withKey(key, 8080), withEndpoints())
	log.audited(t, empty, "the empty chunk is audited")
	audits := log.count(client.ObjectKeyFromObject(flood)) + log.count(client.ObjectKeyFromObject(empty))
	assert.LessOrEqual(t, reads.n.Load()-readsBefore, int64(audits*(1+audit.MaxRereads)),
		"an audit costs at most 1 + %d Pod reads, however many names", audit.MaxRereads)

	// The window runs (the clock stands still): the status counts none of it.
	reconciled := run.reconciles()
	update(t, b.swh, func(swh *v1alpha1.ServiceWithHealthchecks) {
		metav1.SetMetaDataAnnotation(&swh.ObjectMeta, "touch", "1")
	})
	require.Eventually(t, func() bool { return run.reconciles() > reconciled }, wait, tick, "the resource is reconciled with the flood")
	var swh v1alpha1.ServiceWithHealthchecks
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(b.swh), &swh))
	require.Len(t, swh.Status.Ports, 1)
	assert.Equal(t, total, swh.Status.Ports[0].TotalEndpoints, "the flood is not counted")
	if assert.Len(t, swh.Status.Ports[0].NotReady, 1) {
		assert.Equal(t, "web-4", swh.Status.Ports[0].NotReady[0].Pod, "the real failing Pod is listed, no ghost")
	}

	clock.advance(2 * audit.DefaultWindow)
	gone(t, flood, "the flood of not-ready ghosts is removed")
	gone(t, empty, "the empty chunk is removed")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var notes []string
		for _, e := range eventsAbout(t, ns, "web", audit.EventForged) {
			notes = append(notes, e.Note)
			assert.LessOrEqual(c, len(e.Note), audit.MaxNote, "the note is capped")
		}
		all := strings.Join(notes, "\n")
		assert.Contains(c, all, "not-ready endpoint: pod aaa-ghost-0000 does not exist")
		assert.Contains(c, all, "more", "the list of a thousand is cut")
		assert.Contains(c, all, audit.ReasonEmpty)
		assert.Contains(c, all, b.node, "the Events name the node")
	}, wait, tick)
	assert.NotEmpty(t, nodeEvents(t, b.node, ""), "the Node has an Event")
	b.kept(t)
	countsTo(t, run.metrics.ForgedSlices, 2)
}

// TestForgedAfterTheFactAPodDeletedRelabelledOrEndedIsJudgedAgain: the audit looks again at a
// slice that was clean when a Pod it names is later deleted, relabelled out of the selector or
// ends (phase Failed), through the index from Pods to the slices that name them, without a
// change of the slice; an agent that does not withdraw such an endpoint has its slice removed.
// Positive control: the honest slices stay.
func TestForgedAfterTheFactAPodDeletedRelabelledOrEndedIsJudgedAgain(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "afterfact")
	var log *auditLog
	run := startController(t, ns, func(o *Options) { o.SkipAudit = false; log = newAuditLog(o) })
	b := newHonestBed(t, ns)
	sel := map[string]string{"app": "web"}
	changes := []struct {
		name   string
		change func(*corev1.Pod)
	}{
		// No kubelet confirms a graceful deletion here: the Pod goes at once, as a kubelet's
		// confirmation or a force deletion makes it go.
		{"deleted", func(p *corev1.Pod) {
			require.NoError(t, env.Client.Delete(t.Context(), p, client.GracePeriodSeconds(0)))
		}},
		{"relabelled", func(p *corev1.Pod) {
			update(t, p, func(p *corev1.Pod) { p.Labels = map[string]string{"app": "other"} })
		}},
		{"ended", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodFailed
			require.NoError(t, env.Client.Status().Update(t.Context(), p))
		}},
	}
	type victim struct {
		pod   *corev1.Pod
		slice *discoveryv1.EndpointSlice
	}
	var victims []victim
	for i, c := range changes {
		ip := fmt.Sprintf("10.6.0.%d", i+1)
		pod := podWithPorts(t, ns, "web-"+c.name, b.node, 8080, sel, ip)
		key := slicemeta.SliceKey{Resource: "web", Port: "http", Node: b.node, Chunk: i + 2}
		s := slice(t, ns, "web", b.swh.UID, "http", b.node, withKey(key, 8080), withEndpoints(endpointOf(pod, ip, b.node)))
		victims = append(victims, victim{pod, s})
	}
	for _, v := range victims {
		log.audited(t, v.slice, "the slice is audited")
	}
	require.Zero(t, testutil.ToFloat64(run.metrics.ForgedSlices), "clean at first")
	for i, c := range changes {
		c.change(victims[i].pod)
	}
	for i, v := range victims {
		gone(t, v.slice, "the slice naming the "+changes[i].name+" Pod is removed")
	}
	b.kept(t)
	assert.Equal(t, float64(len(changes)), testutil.ToFloat64(run.metrics.ForgedSlices))
}
