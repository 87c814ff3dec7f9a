// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/notready"
	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/metrics"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// chunkSize is the --max-endpoints-per-slice of node-a's agent while the chunk scenario runs.
const chunkSize = 3

// The slices of port http of resource web on node-a (api/slicemeta SliceKey.Name): the common
// name is chunk 0, the further chunks carry "---<k>-" before the node.
const (
	chunk0 = "web-http-node-a"
	chunk1 = "web-http---1-node-a"
	chunk2 = "web-http---2-node-a"
)

// chunkPorts are the container ports of the chunk scenario's pods: traffic on http, the probe
// on a dedicated health port (a whole-pod probe, docs/README.md "The per-port rule"), so a pod
// taken out by its probe still answers the requests that reach it.
var chunkPorts = []corev1.ContainerPort{
	{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
	{Name: "health", ContainerPort: 8081, Protocol: corev1.ProtocolTCP},
}

// Issue 32 part 3 with the real programs: a port's endpoints on one node beyond the agent's
// --max-endpoints-per-slice go into further slices (chunks). node-a's agent runs with a size of
// 3 for this test. Two pods make one slice of the common name; eight make three slices of at
// most three endpoints each, every pod in exactly one, the first two still in the common one,
// and kube-proxy routes to all eight. A controller leader change (the new leader reconciles the
// resource and audits every slice) deletes none of them. One pod failing its probe writes only
// its chunk; the status counts the ready endpoints of all chunks and names the pod. Shrunk to
// one pod (which sat in the last chunk), the group merges back into the common name, which is
// written with that pod before its chunk is deleted. A request loop through the ClusterIP runs
// across it all and sees zero failed requests.
func TestAPortBeyondTheSliceSizeIsSplitIntoChunksAndMergedBack(t *testing.T) {
	s := testStack(t)
	c := s.Cluster
	useSliceSize(t, s, "node-a", chunkSize)
	ns := c.Env.CreateNamespaceForTest(t, "chunks")
	labels := map[string]string{"app": "web"}
	var pods []*cluster.Pod
	health := map[string]*cluster.Server{}
	add := func(i int) {
		p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-" + strconv.Itoa(i), Node: "node-a", Labels: labels, ContainerPorts: chunkPorts})
		p.ServeHTTP(t, 8080)
		health[ip(p)] = p.ServeHTTP(t, 8081)
		pods = append(pods, p)
	}
	add(0)
	add(1)
	createResource(t, c, kit.Resource(ns, "web", labels,
		[]v1alpha1.ServicePort{e2e.ServicePort("http", 80, intstr.FromString("http"))},
		kit.HTTPProbe(intstr.FromString("health"))))
	kit.EventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{chunk0: {ip(pods[0]): "TTF", ip(pods[1]): "TTF"}})
	c.WaitProgrammed(t, ns+"/web", 80, pods...)
	w := watchSlices(t, c, ns)
	loop := c.Traffic(t, cluster.TrafficOptions{Service: ns + "/web", Port: 80, Duration: loopFor})
	logTimelineOnFailure(t, w, loop)
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)

	// Scale to eight pods: chunks appear.
	scaling := time.Now()
	for i := 2; i < 8; i++ {
		add(i)
	}
	var layout map[string]map[string]string
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		got, err := e2e.EndpointsOf(t.Context(), c, ns, "web")
		require.NoError(ct, err)
		layout = got
		assert.ElementsMatch(ct, []string{chunk0, chunk1, chunk2}, slices.Collect(maps.Keys(got)), "the common name and chunks 1 and 2")
		assert.Equal(ct, allReady(pods), merged(got), "every pod ready in exactly one slice")
	}, waitFor, poll, "eight pods on node-a in chunks of %d", chunkSize)
	for name, eps := range layout {
		assert.LessOrEqual(t, len(eps), chunkSize, "slice %s holds at most %d endpoints: %v", name, chunkSize, eps)
	}
	assert.Contains(t, layout[chunk0], ip(pods[0]), "the first pods stay in the slice that listed them")
	assert.Contains(t, layout[chunk0], ip(pods[1]), "the first pods stay in the slice that listed them")
	t.Logf("chunks: eight pods in %v", layout)
	c.WaitProgrammed(t, ns+"/web", 80, pods...)
	scaled := time.Now()
	require.Eventually(t, func() bool { return len(loop.Results().Since(scaled).ByPod()) == len(pods) }, waitFor, poll,
		"kube-proxy routes requests to every pod of every chunk")
	kit.WaitRequestsAfter(t, loop, scaled, minInWindow)
	chunkOf := map[string]string{}
	for name, eps := range layout {
		for addr := range eps {
			chunkOf[addr] = name
		}
	}

	// A controller resync: the new leader reconciles the resource (its status gauges count the
	// endpoints of all chunks) and audits every live slice; none of the chunks goes.
	uids := sliceField(t, c, ns, sliceUID)
	kit.ChangeLeader(t, s)
	leader, err := s.Leader()
	require.NoError(t, err)
	owned := ownedSlices(t, c)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		fams, err := metrics.Get(t.Context(), s.ControllerMetricsAddr(leader))
		require.NoError(ct, err)
		assert.Equal(ct, float64(len(pods)), fams.Sum("swh_controller_port_ready_endpoints", map[string]string{"namespace": ns, "name": "web", "port": "http"}),
			"the new leader counts the ready endpoints of every chunk")
		assert.GreaterOrEqual(ct, fams.Sum("swh_controller_audited_endpointslices_total", nil), float64(owned),
			"the new leader audited the %d slices of live resources", owned)
	}, waitFor, poll)

	// One pod of chunk 1 fails its probe: only chunk 1 is written.
	victim := podAt(t, pods, layout[chunk1])
	before := sliceField(t, c, ns, sliceVersion)
	failing := time.Now()
	health[ip(victim)].SetHTTPStatus(503)
	want := map[string]map[string]string{}
	for name, eps := range layout {
		want[name] = map[string]string{}
		for addr := range eps {
			want[name][addr] = "TTF"
		}
	}
	want[chunk1][ip(victim)] = "FFF"
	kit.EventuallyEndpoints(t, c, ns, "web", want)
	c.WaitProgrammed(t, ns+"/web", 80, without(pods, victim)...)
	withdrawn := time.Now()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		swh := &v1alpha1.ServiceWithHealthchecks{}
		require.NoError(ct, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "web"}, swh))
		require.Len(ct, swh.Status.Ports, 1)
		p := swh.Status.Ports[0]
		assert.Equal(ct, int32(len(pods)-1), p.ReadyEndpoints, "ready endpoints of all chunks")
		assert.Equal(ct, int32(len(pods)), p.TotalEndpoints, "endpoints of all chunks")
		assert.Equal(ct, []v1alpha1.NotReadyPod{{Pod: victim.Name, Node: "node-a", Reason: "probe 0 (HTTP): HTTP 503"}}, p.NotReady)
	}, waitFor, poll, "the status counts every chunk and names %s", victim.Name)
	waitProbes(t, health[ip(victim)]) // the probes go on: anything they would write is written
	after := sliceField(t, c, ns, sliceVersion)
	for name, rv := range before {
		if name != chunk1 {
			assert.Equal(t, rv, after[name], "slice %s is not written when a pod of %s fails", name, chunk1)
		}
	}
	assert.NotEqual(t, before[chunk1], after[chunk1], "the victim's chunk is written")
	var written []string
	for _, ch := range w.Changes() {
		if !ch.At.Before(failing) {
			written = append(written, ch.Slice)
		}
	}
	assert.Equal(t, []string{chunk1}, written, "one write, of the victim's chunk")
	assert.Equal(t, []string{chunk1 + ": " + ip(victim) + " TTF -> FFF"}, w.ConditionChanges()[len(w.ConditionChangesBefore(failing)):])
	_, bySlice, err := e2e.SlicesOf(t.Context(), c, ns, "web")
	require.NoError(t, err)
	for name, sl := range bySlice {
		note := sl.Annotations[notready.Annotation]
		if name == chunk1 {
			assert.Equal(t, `{"`+victim.Name+`":"probe 0 (HTTP): HTTP 503"}`, note, "the agent's note on the victim's chunk")
		} else {
			assert.Empty(t, note, "no note on %s", name)
		}
	}
	for name, uid := range sliceField(t, c, ns, sliceUID) {
		assert.Equal(t, uids[name], uid, "slice %s is the one published before the leader change", name)
	}

	// Shrink to one pod, one of the last chunk: every other pod drains (terminating, still
	// serving) and is removed; the group merges into the common name.
	keep := podAt(t, pods, layout[chunk2])
	shrinking := time.Now()
	for _, p := range without(pods, keep) {
		p.MarkTerminating(t)
	}
	c.WaitProgrammed(t, ns+"/web", 80, keep)
	drained := time.Now()
	kit.WaitRequestsAfter(t, loop, drained, minInWindow)
	for _, p := range without(pods, keep) {
		p.Delete(t)
	}
	kit.EventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{chunk0: {ip(keep): "TTF"}})
	mergedAt := time.Now()
	kit.WaitRequestsAfter(t, loop, mergedAt, minInWindow)
	res := loop.Stop()

	kit.RequireWindow(t, res, "the scale-up, from the first new pod to every pod routed", scaling, scaled)
	window := kit.RequireWindow(t, res, "the shrink, from the first drain to the merge", shrinking, mergedAt)
	assert.Empty(t, res.Failed(), "requests: %s; failed: %s", res, e2e.Failures(res))
	assert.Zero(t, res.Since(withdrawn).ByPod()[victim.Key()], "no request reaches %s once it is withdrawn", victim.Name)
	afterDrain := res.Since(drained)
	assert.Equal(t, map[string]int{keep.Key(): len(afterDrain)}, afterDrain.ByPod(), "once the others drain, only %s answers", keep.Name)

	// The slice events: no slice went while the group was split, the kept pod was published
	// ready after every event, and the common name listed it before its chunk was deleted.
	changes := w.Changes()
	var listedAt, deletedAt time.Time
	for _, ch := range changes {
		switch {
		case ch.Type == watch.Deleted && ch.At.Before(shrinking):
			t.Errorf("slice %s deleted at %s, while the group was split", ch.Slice, ch.At.Format("15:04:05.000"))
		case ch.Type == watch.Deleted && ch.Slice == chunkOf[ip(keep)] && deletedAt.IsZero():
			deletedAt = ch.At
		case ch.Type != watch.Deleted && ch.Slice == chunk0 && ch.Endpoints[ip(keep)] == "TTF" && listedAt.IsZero():
			listedAt = ch.At
		}
	}
	require.False(t, listedAt.IsZero(), "the common name lists %s", keep.Name)
	require.False(t, deletedAt.IsZero(), "%s, the chunk of %s, is deleted", chunkOf[ip(keep)], keep.Name)
	assert.True(t, listedAt.Before(deletedAt), "the common name lists %s (%s) before its chunk %s is deleted (%s)",
		keep.Name, listedAt.Format("15:04:05.000"), chunkOf[ip(keep)], deletedAt.Format("15:04:05.000"))
	assert.Empty(t, unpublished(w.Initial(), changes, ip(keep)), "%s is ready in some slice after every slice event", keep.Name)
	t.Logf("chunks: %d requests in the shrink window (%s), %d in the whole loop, %d failed", len(window),
		mergedAt.Sub(shrinking).Round(time.Millisecond), len(res), len(res.Failed()))
}

// useSliceSize restarts the node's agent with --max-endpoints-per-slice=size for the test; when
// the test ends the stack's own agent flags are back and the node's agent restarts with them.
func useSliceSize(t *testing.T, s *stack.Stack, node string, size int) {
	t.Helper()
	opts := s.Options()
	controllerArgs, agentArgs := slices.Clone(opts.ControllerArgs), slices.Clone(opts.AgentArgs)
	t.Cleanup(func() {
		s.UsePrograms(s.Binaries, controllerArgs, agentArgs)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := s.RestartAgent(ctx, node); err != nil {
			t.Errorf("restarting the agent of %s with the stack's flags: %v", node, err)
		}
	})
	s.UsePrograms(s.Binaries, controllerArgs, append(slices.Clone(agentArgs), "--max-endpoints-per-slice="+strconv.Itoa(size)))
	pid := s.AgentPID(node)
	require.NoError(t, s.RestartAgent(t.Context(), node))
	require.NotEqual(t, pid, s.AgentPID(node), "the agent of %s is a new process", node)
}

// allReady is every pod's address with "TTF".
func allReady(pods []*cluster.Pod) map[string]string {
	out := map[string]string{}
	for _, p := range pods {
		out[ip(p)] = "TTF"
	}
	return out
}

// merged is the endpoints of all slices in one map; an address listed twice is marked "twice".
func merged(bySlice map[string]map[string]string) map[string]string {
	out := map[string]string{}
	for _, eps := range bySlice {
		for addr, conds := range eps {
			if _, dup := out[addr]; dup {
				conds = "twice"
			}
			out[addr] = conds
		}
	}
	return out
}

// podAt is the pod of the first address (in order) of a slice's endpoints.
func podAt(t *testing.T, pods []*cluster.Pod, eps map[string]string) *cluster.Pod {
	t.Helper()
	addrs := slices.Sorted(maps.Keys(eps))
	require.NotEmpty(t, addrs)
	for _, p := range pods {
		if ip(p) == addrs[0] {
			return p
		}
	}
	t.Fatalf("no pod has address %s", addrs[0])
	return nil
}

// without is pods but p.
func without(pods []*cluster.Pod, p *cluster.Pod) []*cluster.Pod {
	var out []*cluster.Pod
	for _, q := range pods {
		if q != p {
			out = append(out, q)
		}
	}
	return out
}

// sliceField is one field of each of the resource web's slices in the namespace, by name: the
// resourceVersion (a write) or the UID (a recreation).
func sliceField[V any](t *testing.T, c *cluster.Cluster, ns string, field func(*discoveryv1.EndpointSlice) V) map[string]V {
	t.Helper()
	_, bySlice, err := e2e.SlicesOf(t.Context(), c, ns, "web")
	require.NoError(t, err)
	out := map[string]V{}
	for name, s := range bySlice {
		out[name] = field(&s)
	}
	return out
}

func sliceVersion(s *discoveryv1.EndpointSlice) string { return s.ResourceVersion }

func sliceUID(s *discoveryv1.EndpointSlice) types.UID { return s.UID }

// ownedSlices counts the module's slices in the cluster whose resource lives and owns them: the
// slices a new controller leader audits (a slice of a gone resource is the garbage collector's).
func ownedSlices(t *testing.T, c *cluster.Cluster) int {
	t.Helper()
	var list discoveryv1.EndpointSliceList
	require.NoError(t, c.Env.Client.List(t.Context(), &list, client.MatchingLabels{discoveryv1.LabelManagedBy: wellknown.ManagedBy}))
	n := 0
	for i := range list.Items {
		sl := &list.Items[i]
		swh := &v1alpha1.ServiceWithHealthchecks{}
		err := c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: sl.Namespace, Name: slicemeta.ResourceOf(sl)}, swh)
		if apierrors.IsNotFound(err) {
			continue
		}
		require.NoError(t, err)
		if slicemeta.IsOwnedBy(sl, swh.UID) && sl.DeletionTimestamp == nil {
			n++
		}
	}
	return n
}

// unpublished replays the slice events from the initial state and lists each event after which
// the address was ready in no slice, once it had been.
func unpublished(initial map[string]map[string]string, changes []sliceChange, addr string) []string {
	state := map[string]map[string]string{}
	for name, eps := range initial {
		state[name] = eps
	}
	ready := func() bool {
		for _, eps := range state {
			if eps[addr] == "TTF" {
				return true
			}
		}
		return false
	}
	seen := ready()
	var out []string
	for _, ch := range changes {
		switch ch.Type {
		case watch.Error:
			out = append(out, ch.Slice)
			continue
		case watch.Deleted:
			delete(state, ch.Slice)
		default:
			state[ch.Slice] = ch.Endpoints
		}
		switch now := ready(); {
		case now:
			seen = true
		case seen:
			out = append(out, fmt.Sprintf("%s %s %s (slices then: %v)", ch.At.Format("15:04:05.000"), ch.Type, ch.Slice, slices.Sorted(maps.Keys(state))))
		}
	}
	return out
}
