package agent_test

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// hangingServer accepts connections on a port of a pod and never answers: every probe against
// it runs until its timeout. It counts the connections it accepted and those it holds open.
type hangingServer struct {
	ln       net.Listener
	accepted atomic.Int64
	open     atomic.Int64

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// serveHanging starts a hanging server on port of the pod; it stops at the end of the test.
func serveHanging(tb testing.TB, p *cluster.Pod, port int) *hangingServer {
	tb.Helper()
	var ln net.Listener
	require.NoError(tb, p.InNetns(func() error {
		var err error
		ln, err = net.Listen("tcp4", ":"+strconv.Itoa(port))
		return err
	}))
	h := &hangingServer{ln: ln, conns: map[net.Conn]struct{}{}}
	h.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.conns[c] = struct{}{}
			h.mu.Unlock()
			h.accepted.Add(1)
			h.open.Add(1)
			h.wg.Go(func() {
				// Read the request and whatever follows, answer nothing; the prober's close
				// (its timeout, or the agent stopping) ends it.
				_, _ = io.Copy(io.Discard, c)
				h.open.Add(-1)
				h.mu.Lock()
				delete(h.conns, c)
				h.mu.Unlock()
				_ = c.Close()
			})
		}
	})
	tb.Cleanup(h.stop)
	return h
}

func (h *hangingServer) stop() {
	_ = h.ln.Close()
	h.mu.Lock()
	for c := range h.conns {
		_ = c.Close()
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// held is how many connections the hanging servers hold open: probes in flight against them.
func held(hs []*hangingServer) int64 {
	var n int64
	for _, h := range hs {
		n += h.open.Load()
	}
	return n
}

// createProbedResource is createResource with a period of one's choosing: a probe's
// timeoutSeconds may not exceed the period.
func createProbedResource(tb testing.TB, c *cluster.Cluster, ns, name string, selector map[string]string, period int32, ports []v1alpha1.ServicePort, probes ...v1alpha1.Probe) *v1alpha1.ServiceWithHealthchecks {
	tb.Helper()
	swh := &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Ports:       ports,
			Selector:    selector,
			Type:        corev1.ServiceTypeClusterIP,
			Healthcheck: &v1alpha1.Healthcheck{InitialDelaySeconds: 0, PeriodSeconds: period, Probes: probes},
		},
	}
	require.NoError(tb, c.Env.Client.Create(tb.Context(), swh))
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference(name, swh.UID)}}}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: p.Name, Port: p.Port, Protocol: p.Protocol, TargetPort: p.TargetPort})
	}
	require.NoError(tb, c.Env.Client.Create(tb.Context(), svc))
	return swh
}

// hangingProbes are n HTTP probes of port 8080 with timeoutSeconds 60.
func hangingProbes(n int) []v1alpha1.Probe {
	probes := make([]v1alpha1.Probe, n)
	for i := range probes {
		probes[i] = httpProbe(intstr.FromInt32(8080), 1, 3)
		probes[i].TimeoutSeconds = 60
	}
	return probes
}

// Issue 16, part 2: 96 HTTP probes that never get an answer (three resources of 32 probes,
// timeoutSeconds 60) in one namespace, and another namespace's probe with periodSeconds 1. The
// agent runs with its default pool of 64 workers. The hanging namespace may hold at most half of
// them (two namespaces have targets), so the other namespace's probe keeps running and its
// stopped server is withdrawn within periodSeconds x failureThreshold + timeoutSeconds + 1 s
// (asserted with three times that). With one shared queue, the hanging probes held every worker
// and the stopped server stayed ready for as long as they hung.
func TestAHangingNamespaceDoesNotDelayAnotherNamespacesProbes(t *testing.T) {
	c := testCluster(t)
	hang := c.Env.CreateNamespaceForTest(t, "hang")
	calm := c.Env.CreateNamespaceForTest(t, "calm")
	ports := []v1alpha1.ServicePort{namedPort("web", 80, intstr.FromInt32(8080))}
	var hangers []*hangingServer
	for i := range 3 {
		name := fmt.Sprintf("hang-%d", i)
		labels := map[string]string{"app": name}
		p := c.AddPod(t, cluster.PodSpec{Namespace: hang, Name: name, Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
		hangers = append(hangers, serveHanging(t, p, 8080))
		createProbedResource(t, c, hang, name, labels, 60, ports, hangingProbes(32)...)
	}
	labels := map[string]string{"app": "web"}
	web := c.AddPod(t, cluster.PodSpec{Namespace: calm, Name: "web-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	srv := web.ServeHTTP(t, 8080)
	const period, failureThreshold, timeout = 1, 3, 1
	createResource(t, c, calm, "web", labels, ports, httpProbe(intstr.FromInt32(8080), 1, failureThreshold))
	startAgent(t, c, "node-a")
	bound := 3 * (period*failureThreshold + timeout + 1) * time.Second

	eventuallySlices(t, c, calm, "web", map[string]map[string]string{"web-web-node-a": {ip(web): "TTF"}})
	// The hanging probes are in flight: at least a quarter of the pool.
	require.Eventually(t, func() bool { return held(hangers) >= 16 }, time.Minute, 50*time.Millisecond,
		"the hanging servers hold connections")

	hits := srv.Hits()
	assert.Eventually(t, func() bool { return srv.Hits() >= hits+3 }, bound, 50*time.Millisecond,
		"the calm namespace's probe keeps running beside the hanging ones")
	t.Logf("the calm namespace's probe ran %d times since the hanging probes hold workers", srv.Hits()-hits)
	srv.Stop()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		got, err := slicesOf(t.Context(), c, calm, "web")
		require.NoError(ct, err)
		assert.Equal(ct, "FFF", got["web-web-node-a"].Endpoints[ip(web)])
	}, bound, 50*time.Millisecond, "the stopped server is withdrawn within %s", bound)

	// The hanging probes were holding workers all along (their timeout is a minute), and no more
	// than their namespace's share: 64 workers / 2 namespaces with targets.
	n := held(hangers)
	assert.GreaterOrEqual(t, n, int64(16), "hanging probes in flight")
	assert.LessOrEqual(t, n, int64(32), "hanging probes in flight")
}

// Lateness is visible, and decides nothing. With 2 workers and two namespaces with targets,
// each namespace runs one probe at a time; four probes that never get an answer (timeoutSeconds
// 2, periodSeconds 2) share their namespace's one slot, so each waits for the others far longer
// than its period. The agent counts those late runs and records a Warning Event ProbesLate on
// the resource whose probes are late, not on the other namespace's; the hanging probes still
// fail by their timeout and withdraw their endpoint.
func TestProbesThatWaitForAWorkerAreReportedLate(t *testing.T) {
	c := testCluster(t)
	slow := c.Env.CreateNamespaceForTest(t, "slow")
	calm := c.Env.CreateNamespaceForTest(t, "calm")
	ports := []v1alpha1.ServicePort{namedPort("web", 80, intstr.FromInt32(8080))}
	hangLabels := map[string]string{"app": "hang"}
	hp := c.AddPod(t, cluster.PodSpec{Namespace: slow, Name: "hang-0", Node: "node-a", Labels: hangLabels, ContainerPorts: vmPorts})
	h := serveHanging(t, hp, 8080)
	probes := hangingProbes(4)
	for i := range probes {
		probes[i].TimeoutSeconds = 2
		probes[i].FailureThreshold = 1
	}
	createProbedResource(t, c, slow, "hang", hangLabels, 2, ports, probes...)
	labels := map[string]string{"app": "web"}
	web := c.AddPod(t, cluster.PodSpec{Namespace: calm, Name: "web-0", Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
	web.ServeHTTP(t, 8080)
	createResource(t, c, calm, "web", labels, ports, httpProbe(intstr.FromInt32(8080), 1, 3))
	a := startAgent(t, c, "node-a", func(o *agent.Options) { o.ProbeConcurrency = 2 })

	eventuallyEvent(t, c, slow, agent.ReasonProbesLate, "hang: probes on node node-a start more than one period late")
	assert.Positive(t, testutil.ToFloat64(a.Metrics.LateRuns), "late runs are counted")
	assert.GreaterOrEqual(t, h.accepted.Load(), int64(2), "the hanging probes ran, one after the other")
	eventuallySlices(t, c, slow, "hang", map[string]map[string]string{"hang-web-node-a": {ip(hp): "FFF"}})
	eventuallySlices(t, c, calm, "web", map[string]map[string]string{"web-web-node-a": {ip(web): "TTF"}})
	var evs eventsv1.EventList
	require.NoError(t, c.Env.Client.List(t.Context(), &evs, client.InNamespace(calm)))
	for _, e := range evs.Items {
		assert.NotEqual(t, agent.ReasonProbesLate, e.Reason, "the calm namespace's probe was never late: %s", e.Note)
	}
}
