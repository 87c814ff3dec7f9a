// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/prober"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/scheduler"
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

// BenchmarkNoisyNeighbour is the "noisy neighbour" suite (bench/noisy-neighbour/run.sh,
// development/BENCHMARKS.md): NOISY_HANGING HTTP probes that never get an answer (resources of
// 32 probes, timeoutSeconds and periodSeconds 60) in one namespace, beside NOISY_NORMAL pods
// probed over HTTP every second (timeoutSeconds 1, failureThreshold 3) in another, one agent in
// this process with the default pool (agent.DefaultProbeConcurrency workers) and the real
// prober. It reports the normal probes' scheduling lag (start - due, from scheduler.Due) over
// NOISY_DURATION once the hanging probes hold their workers, and their failure detection time:
// NOISY_SAMPLES times, one normal pod's server starts answering 503 and the time until a watch
// sees its endpoint not ready is measured (then it recovers before the next sample). Goals:
// lag p99 under 100 ms, detection within periodSeconds x failureThreshold + timeoutSeconds + 1 s.
// Needs root (network namespaces); it is never a pass/fail test.
//
//	cd images/agent/internal/agent && go test . -run '^$' -bench NoisyNeighbour -benchtime 1x
func BenchmarkNoisyNeighbour(b *testing.B) {
	hanging := envInt(b, "NOISY_HANGING", 96)
	normal := envInt(b, "NOISY_NORMAL", 100)
	window := envDuration(b, "NOISY_DURATION", 30*time.Second)
	samples := envInt(b, "NOISY_SAMPLES", 10)
	const period, timeout, failureThreshold = 1, 1, 3
	goal := time.Duration(period*failureThreshold+timeout+1) * time.Second

	c, err := cluster.New(cluster.Options{Nodes: []cluster.Node{{Name: "node-a", Zone: "zone-a"}}})
	if errors.Is(err, cluster.ErrNotRoot) {
		b.Skipf("cluster: %v", err)
	}
	require.NoError(b, err)
	b.Cleanup(func() { assert.NoError(b, c.Stop()) })
	noisy := c.Env.CreateNamespaceForTest(b, "noisy")
	calm := c.Env.CreateNamespaceForTest(b, "calm")
	ports := []v1alpha1.ServicePort{namedPort("web", 80, intstr.FromInt32(8080))}

	var hangers []*hangingServer
	for i := 0; i*32 < hanging; i++ {
		name := fmt.Sprintf("hang-%d", i)
		labels := map[string]string{"app": name}
		p := c.AddPod(b, cluster.PodSpec{Namespace: noisy, Name: name, Node: "node-a", Labels: labels, ContainerPorts: vmPorts})
		hangers = append(hangers, serveHanging(b, p, 8080))
		createProbedResource(b, c, noisy, name, labels, 60, ports, hangingProbes(min(32, hanging-i*32))...)
	}
	labels := map[string]string{"app": "web"}
	bulk := c.AddBulkPods(b, cluster.BulkSpec{Namespace: calm, NamePrefix: "web", Node: "node-a", Count: normal, Port: 8080,
		Labels: labels, ContainerPorts: vmPorts})
	createProbedResource(b, c, calm, "web", labels, period, ports, httpProbe(intstr.FromInt32(8080), 1, failureThreshold))

	a, lags := runAgentMeasuringLag(b, c, calm, 0)

	w := watchReadiness(b, c, calm)
	require.Eventually(b, func() bool { return w.readyCount() == normal }, 2*time.Minute, 50*time.Millisecond,
		"every normal endpoint is published ready")
	// Both namespaces have targets: the hanging one holds at most half of the pool.
	expectHeld := int64(min(hanging, agent.DefaultProbeConcurrency/2))
	require.Eventually(b, func() bool { return held(hangers) >= expectHeld }, 2*time.Minute, 50*time.Millisecond,
		"the hanging probes are in flight")

	b.ResetTimer()
	for range b.N {
		lags.start()
		time.Sleep(window) // the measured window: the probes run meanwhile
		got := lags.stop()
		require.NotEmpty(b, got, "the normal probes ran during the window")

		var detect []time.Duration
		for i := range samples {
			addr := bulk.Pods[i%normal].IP.String()
			bulk.SetHealthy(i%normal, false)
			t0 := time.Now()
			at, ok := w.waitReady(addr, false, t0.Add(time.Minute))
			require.True(b, ok, "the endpoint of %s is withdrawn within a minute", addr)
			detect = append(detect, at.Sub(t0))
			bulk.SetHealthy(i%normal, true)
			_, ok = w.waitReady(addr, true, time.Now().Add(time.Minute))
			require.True(b, ok, "the endpoint of %s is ready again within a minute", addr)
		}
		b.ReportMetric(ms(percentile(got, 0.50)), "lag-p50-ms")
		b.ReportMetric(ms(percentile(got, 0.99)), "lag-p99-ms")
		b.ReportMetric(ms(percentile(got, 1)), "lag-max-ms")
		b.ReportMetric(float64(len(got))/window.Seconds(), "normal-runs/s")
		b.ReportMetric(percentile(detect, 0.50).Seconds(), "detect-p50-s")
		b.ReportMetric(percentile(detect, 1).Seconds(), "detect-max-s")
		b.ReportMetric(goal.Seconds(), "detect-goal-s")
		b.ReportMetric(float64(held(hangers)), "hanging-in-flight")
		b.ReportMetric(testutil.ToFloat64(a.Metrics.LateRuns), "late-runs")
	}
}

// runAgentMeasuringLag runs node-a's agent on c with the real prober until the benchmark ends,
// recording how late each probe of namespace ns starts after its due time. maxTargets 0 keeps
// the default probe budget.
func runAgentMeasuringLag(b *testing.B, c *cluster.Cluster, ns string, maxTargets int) (*agent.Agent, *lagLog) {
	b.Helper()
	lags := &lagLog{}
	pr := agent.ProberRunner(prober.New(prober.Options{}))
	runner := scheduler.RunnerFunc(func(ctx context.Context, t scheduler.Target) scheduler.Outcome {
		if due, ok := scheduler.Due(ctx); ok && t.Namespace == ns {
			lags.add(time.Since(due))
		}
		return pr.Run(ctx, t)
	})
	a, err := agent.New(agent.Options{
		NodeName: "node-a", Config: c.Env.Config, MetricsBindAddress: "0", HealthProbeBindAddress: "0",
		Registry: prometheus.NewRegistry(), SkipNameValidation: true, Runner: runner, MaxProbeTargets: maxTargets,
	})
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	b.Cleanup(func() { cancel(); assert.NoError(b, <-done) })
	return a, lags
}

func envInt(b *testing.B, name string, def int) int {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(b, err, "%s", name)
	require.Positive(b, n, "%s", name)
	return n
}

func envDuration(b *testing.B, name string, def time.Duration) time.Duration {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	require.NoError(b, err, "%s", name)
	require.Positive(b, d, "%s", name)
	return d
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// percentile of the samples (nearest rank; q = 1 is the largest).
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[max(int(math.Ceil(q*float64(len(s))))-1, 0)]
}

// lagLog records scheduling lags while started.
type lagLog struct {
	mu   sync.Mutex
	on   bool
	lags []time.Duration
}

func (l *lagLog) add(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.on {
		l.lags = append(l.lags, d)
	}
}

func (l *lagLog) start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on, l.lags = true, nil
}

func (l *lagLog) stop() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on = false
	return l.lags
}

// readiness follows, through a watch, the ready condition of every endpoint in the
// EndpointSlices of a namespace, with the time each change arrived.
type readiness struct {
	mu      sync.Mutex
	slices  map[string]map[string]bool // slice name -> address -> ready
	changed chan struct{}
}

func watchReadiness(tb testing.TB, c *cluster.Cluster, ns string) *readiness {
	tb.Helper()
	wc, err := client.NewWithWatch(c.Env.Config, client.Options{Scheme: c.Env.Scheme})
	require.NoError(tb, err)
	w, err := wc.Watch(tb.Context(), &discoveryv1.EndpointSliceList{}, client.InNamespace(ns))
	require.NoError(tb, err)
	r := &readiness{slices: map[string]map[string]bool{}, changed: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			s, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok {
				continue
			}
			eps := map[string]bool{}
			for _, e := range s.Endpoints {
				eps[e.Addresses[0]] = e.Conditions.Ready == nil || *e.Conditions.Ready
			}
			r.mu.Lock()
			if ev.Type == watch.Deleted {
				delete(r.slices, s.Name)
			} else {
				r.slices[s.Name] = eps
			}
			r.mu.Unlock()
			select {
			case r.changed <- struct{}{}:
			default:
			}
		}
	}()
	tb.Cleanup(func() { w.Stop(); <-done })
	return r
}

// state is whether addr is published and whether it is ready.
func (r *readiness) state(addr string) (published, ready bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, eps := range r.slices {
		if v, ok := eps[addr]; ok {
			return true, v
		}
	}
	return false, false
}

func (r *readiness) readyCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, eps := range r.slices {
		for _, ready := range eps {
			if ready {
				n++
			}
		}
	}
	return n
}

// waitReady waits until addr is published with that ready condition and returns when the
// watch saw it, or false at the deadline.
func (r *readiness) waitReady(addr string, ready bool, deadline time.Time) (time.Time, bool) {
	for {
		if p, v := r.state(addr); p && v == ready {
			return time.Now(), true
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return time.Time{}, false
		}
		select {
		case <-r.changed:
		case <-time.After(wait):
		}
	}
}
