// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/loopback"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

// targetPort is where the flip server listens in the pods' namespaces.
const targetPort = 8080

// bench holds the cluster, the two programs and the watcher.
type bench struct {
	c     *cluster.Cluster
	o     options
	cs    kubernetes.Interface
	dir   string
	agent *process.Process
	kcm   *process.Process
	// agentMetrics is the agent's metrics address.
	agentMetrics string
	// api reads the API server's metrics (-apiserver-gc; nil otherwise).
	api *apiServer
	// rules follows the dataplane's rules (-dataplane; nil otherwise).
	rules ruleWatch
}

func newBench(ctx context.Context, c *cluster.Cluster, o options) (*bench, error) {
	// The benchmark's clientset plays the kubelet (the status updates) and kube-proxy (the
	// watcher): both talk protobuf, so it does too unless -json asks for the JSON of the first
	// measurements (decoding the agent's 1,000-endpoint slice as JSON cost the watcher several
	// milliseconds per event that no real consumer pays).
	cfg := rest.CopyConfig(c.Env.Config)
	if !o.json {
		cfg.ContentType = runtime.ContentTypeProtobuf
		cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("clientset: %w", err)
	}
	dir, err := os.MkdirTemp("", "swh-bench-publish-")
	if err != nil {
		return nil, fmt.Errorf("temporary directory: %w", err)
	}
	b := &bench{c: c, o: o, cs: cs, dir: dir}
	if o.dataplane != "" {
		if b.rules, err = newRuleWatch(ctx, c, o.dataplane); err != nil {
			return nil, err
		}
	}
	if o.apiServerGC {
		if b.api, err = newAPIServer(c.Env.Config); err != nil {
			return nil, err
		}
	}
	kubeconfig, err := c.Env.WriteKubeConfig(dir)
	if err != nil {
		return nil, err
	}
	leaseNS, err := c.Env.CreateNamespace(ctx, "swh-agent")
	if err != nil {
		return nil, err
	}
	agentKC := kubeconfig
	if o.policies != "" {
		user, err := installPolicies(ctx, c.Env.Config, o.policies)
		if err != nil {
			return nil, err
		}
		if err := waitPolicies(ctx, c.Env.Config, leaseNS, user, agentNode); err != nil {
			return nil, err
		}
		if agentKC, err = agentKubeconfig(kubeconfig, dir, user, agentNode); err != nil {
			return nil, err
		}
	}
	addrs, err := loopback.FreeAddrs(2)
	if err != nil {
		return nil, err
	}
	metricsAddr, healthAddr := addrs[0], addrs[1]
	b.agentMetrics = metricsAddr
	args := []string{"--node-name", agentNode, "--kubeconfig", agentKC, "--lease-namespace", leaseNS,
		"--metrics-bind-address", metricsAddr, "--health-probe-bind-address", healthAddr, "--log-level", "error"}
	args = append(args, strings.Fields(o.agentArgs)...)
	if b.agent, err = startProc("agent", dir, o.agent, args...); err != nil {
		return nil, err
	}
	readyCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := b.agent.WaitHTTP(readyCtx, "http://"+healthAddr+"/readyz"); err != nil {
		b.stop()
		return nil, err
	}
	kcm, err := kcmBinary()
	if err != nil {
		b.stop()
		return nil, err
	}
	// Only the EndpointSlice controller, defaults otherwise (--endpointslice-updates-batch-period 0,
	// --concurrent-service-endpoint-syncs 5, --max-endpoints-per-slice 100); no leader election,
	// no serving port.
	kargs := []string{"--kubeconfig", kubeconfig, "--controllers=endpointslice-controller", "--leader-elect=false",
		"--secure-port=0"}
	kargs = append(kargs, strings.Fields(o.kcmArgs)...)
	if b.kcm, err = startProc("kube-controller-manager", dir, kcm, kargs...); err != nil {
		b.stop()
		return nil, err
	}
	return b, nil
}

func (b *bench) stop() {
	if b.rules != nil {
		b.rules.stop()
	}
	if b.agent != nil {
		_ = b.agent.Stop()
	}
	if b.kcm != nil {
		_ = b.kcm.Stop()
	}
	_ = os.RemoveAll(b.dir)
}

func (b *bench) dumpLogs() {
	if b.agent != nil {
		dumpLog(b.agent)
	}
	if b.kcm != nil {
		dumpLog(b.kcm)
	}
}

// sample is one measured flip.
type sample struct {
	start   time.Time     // agent: the decisive probe's arrival; built-in: the start of the kubelet's writes
	addr    netip.Addr    // the endpoint
	latency time.Duration // decisive instant → watch event
	rules   time.Duration // -dataplane: decisive instant → the dataplane's rule carrying the change
	phase   time.Duration // agent: flip of the server → decisive probe; built-in: the status write's round trip (GET and patch)
	get     time.Duration // built-in, -builtin-write=kubelet: the GET's round trip (the part before the status patch)
	ready   bool          // the direction: the endpoint became ready
}

// round is the samples of one round.
type round struct {
	agent, kcm []sample
	load       string
}

// sizeResult is what one size measured.
type sizeResult struct {
	n           int
	rounds      []round
	setup       time.Duration
	agentCPU    time.Duration // agent CPU time while sampling
	sampling    time.Duration // wall time of the sampling
	agentRSS    int64         // agent VmHWM at the end
	agentWrites float64       // EndpointSlice writes by the agent while sampling
	// agentReconcile is the agent's mean reconcile time while sampling (reading the cache,
	// computing, writing the slice and waiting for the API server's answer).
	agentReconcile time.Duration
	// Median round trip of an update of a copy of one agent / built-in slice.
	agentSliceWrite, kcmSliceWrite time.Duration
	kcmSlices                      int
	agentSlices                    int
	// Mean JSON size of one slice: what one write sends to every watcher.
	kcmSliceBytes, agentSliceBytes int
	// -apiserver-gc: the ends of the API server's GC cycles during the sampling, the cycles
	// that ended unseen, the failed polls, and the API server's allocation per flip.
	gcEnds               []time.Time
	gcMissed, gcErrs     int
	agentAlloc, kcmAlloc float64
}

func (b *bench) measure(ctx context.Context, n int) (res sizeResult, err error) {
	res.n = n
	setupStart := time.Now()
	ns, err := b.c.Env.CreateNamespace(ctx, "publish-"+strconv.Itoa(n))
	if err != nil {
		return res, err
	}
	w, err := newWatcher(ctx, b.cs, ns)
	if err != nil {
		return res, err
	}
	defer w.stop()

	// The agent's side: n pods with a flip server on every address, and a resource that
	// probes them over HTTP every second with thresholds of 1.
	agentLabels := map[string]string{"app": "agent-" + strconv.Itoa(n)}
	srv := newFlipServer()
	defer srv.close()
	var agentIPs []netip.Addr
	if b.o.individual {
		for i := range n {
			p, err := b.c.NewPod(ctx, cluster.PodSpec{Namespace: ns, Name: fmt.Sprintf("agent-%d", i), Node: agentNode, Labels: agentLabels})
			if err != nil {
				return res, err
			}
			defer func() { _ = p.Remove(context.Background()) }()
			if err := p.InNetns(func() error { return srv.listen(netip.AddrPortFrom(p.IP, targetPort).String()) }); err != nil {
				return res, err
			}
			agentIPs = append(agentIPs, p.IP)
		}
	} else {
		bulk, err := b.c.NewBulkPods(ctx, cluster.BulkSpec{Namespace: ns, NamePrefix: "agent", Node: agentNode, Count: n, Labels: agentLabels})
		if err != nil {
			return res, err
		}
		defer func() { _ = bulk.Remove(context.Background()) }()
		if err := bulk.InNetns(func() error { return srv.listen(":" + strconv.Itoa(targetPort)) }); err != nil {
			return res, err
		}
		agentIPs = addrs(n, func(i int) netip.Addr { return bulk.Pods[i].IP })
	}
	srv.track(agentIPs)
	swh := &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "agent"},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Selector: agentLabels,
			Ports:    []v1alpha1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(targetPort)}},
			Healthcheck: &v1alpha1.Healthcheck{PeriodSeconds: 1, Probes: []v1alpha1.Probe{{
				Mode: v1alpha1.ProbeModeHTTP, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 1,
				HTTP: &v1alpha1.HTTPProbe{TargetPort: intstr.FromInt32(targetPort), Path: "/healthz"},
			}}},
		},
	}
	if err := b.c.Env.Client.Create(ctx, swh); err != nil {
		return res, fmt.Errorf("creating the ServiceWithHealthchecks: %w", err)
	}
	// No controller runs here: stand in for it, as the agent publishes only for a resource
	// whose status says its child Service is its own.
	child := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: swh.Name, OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference(swh.Name, swh.UID)}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(targetPort)}}},
	}
	if err := b.c.Env.Client.Create(ctx, child); err != nil {
		return res, fmt.Errorf("creating the child Service: %w", err)
	}
	swh.Status.ClusterIP = child.Spec.ClusterIP
	if err := b.c.Env.Client.Status().Update(ctx, swh); err != nil {
		return res, fmt.Errorf("writing the resource's status: %w", err)
	}

	// The built-in side: n Pod objects (no network: nothing dials them) selected by a Service.
	kcmPods, err := newStatusPods(ctx, b.c, b.cs, b.o.builtinWrite, ns, n)
	if err != nil {
		return res, err
	}
	defer kcmPods.remove()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "builtin"},
		Spec: corev1.ServiceSpec{
			Selector: kcmPods.labels,
			Ports:    []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(targetPort)}},
		},
	}
	if err := b.c.Env.Client.Create(ctx, svc); err != nil {
		return res, fmt.Errorf("creating the Service: %w", err)
	}

	// Both sides publish every endpoint ready before the first flip.
	if err := w.waitAllReady(ctx, "agent", agentIPs, 5*time.Minute, b.agent); err != nil {
		return res, fmt.Errorf("the agent's slices: %w", err)
	}
	if err := w.waitAllReady(ctx, "builtin", kcmPods.ips, 5*time.Minute, b.kcm); err != nil {
		return res, fmt.Errorf("the built-in slices: %w", err)
	}
	if b.rules != nil {
		// The dataplane routes every endpoint of both sides before the first flip: a rule
		// written for the start must not end a sample.
		for _, side := range []struct {
			name string
			n    int
		}{{"agent", len(agentIPs)}, {"builtin", len(kcmPods.ips)}} {
			if err := b.waitRouted(ctx, ns+"/"+side.name, side.n); err != nil {
				return res, err
			}
		}
	}
	res.setup = time.Since(setupStart)
	res.agentSlices, res.agentSliceBytes = w.slices("agent")
	res.kcmSlices, res.kcmSliceBytes = w.slices("builtin")

	before, err := agentMetrics(ctx, b)
	if err != nil {
		return res, err
	}
	cpuBefore, err := process.CPUTime(b.agent.PID())
	if err != nil {
		return res, err
	}
	var gc *gcWatch
	if b.api != nil {
		gc = b.api.watchGC(ctx)
	}
	samplingStart := time.Now()
	// Each endpoint in turn goes down, then up again; the two paths alternate sample by
	// sample, so load from elsewhere hits both alike.
	next := 0
	for r := range b.o.rounds {
		rd := round{load: process.LoadAvg()}
		for s := range b.o.samples {
			i := (next / 2 * 7919) % n // spread over the slice; each endpoint down then up
			ready := next%2 == 1
			next++
			as, err := b.agentSample(ctx, w, srv, agentIPs[i], ready)
			if err != nil {
				return res, fmt.Errorf("round %d, sample %d, agent: %w", r+1, s+1, err)
			}
			rd.agent = append(rd.agent, as)
			ks, err := b.kcmSample(ctx, w, kcmPods, i, ready)
			if err != nil {
				return res, fmt.Errorf("round %d, sample %d, built-in: %w", r+1, s+1, err)
			}
			rd.kcm = append(rd.kcm, ks)
		}
		res.rounds = append(res.rounds, rd)
		fmt.Fprintf(os.Stderr, "publish: %d endpoints, round %d: agent p50 %s p99 %s; built-in p50 %s p99 %s (load %s)\n", n, r+1,
			ms(pct(lat(rd.agent), 50)), ms(pct(lat(rd.agent), 99)), ms(pct(lat(rd.kcm), 50)), ms(pct(lat(rd.kcm), 99)), rd.load)
	}
	res.sampling = time.Since(samplingStart)
	if gc != nil {
		res.gcEnds, res.gcMissed, res.gcErrs = gc.result()
	}
	cpuAfter, err := process.CPUTime(b.agent.PID())
	if err != nil {
		return res, err
	}
	res.agentCPU = cpuAfter - cpuBefore
	after, err := agentMetrics(ctx, b)
	if err != nil {
		return res, err
	}
	delta := func(name string) float64 { return after.Sum(name, nil) - before.Sum(name, nil) }
	res.agentWrites = delta("swh_agent_endpointslice_writes_total")
	if n := delta("controller_runtime_reconcile_time_seconds_count"); n > 0 {
		res.agentReconcile = time.Duration(delta("controller_runtime_reconcile_time_seconds_sum") / n * float64(time.Second))
	}
	if res.agentRSS, err = process.PeakRSS(b.agent.PID()); err != nil {
		return res, err
	}
	if gc != nil { // after the agent's figures, which count the sampling only
		flip := func(side func(ctx context.Context, i int, ready bool) error) func(context.Context) error {
			return func(ctx context.Context) error {
				i, ready := (next/2*7919)%n, next%2 == 1 // the sampling's sequence, continued
				next++
				return side(ctx, i, ready)
			}
		}
		res.agentAlloc, res.kcmAlloc, err = b.api.allocPerFlip(ctx,
			flip(func(ctx context.Context, i int, ready bool) error {
				_, err := b.agentSample(ctx, w, srv, agentIPs[i], ready)
				return err
			}),
			flip(func(ctx context.Context, i int, ready bool) error {
				_, err := b.kcmSample(ctx, w, kcmPods, i, ready)
				return err
			}))
		if err != nil {
			return res, err
		}
	}
	if res.agentSliceWrite, err = b.writeCost(ctx, w, "agent", 20, true); err != nil {
		return res, err
	}
	if res.kcmSliceWrite, err = b.writeCost(ctx, w, "builtin", 20, false); err != nil {
		return res, err
	}
	if err := b.c.Env.Client.Delete(ctx, swh); err != nil {
		return res, fmt.Errorf("deleting the ServiceWithHealthchecks: %w", err)
	}
	return res, nil
}

// agentSample flips the server's answer for addr and measures from the decisive probe's arrival
// at the server to the watch event that shows the endpoint's new ready state.
func (b *bench) agentSample(ctx context.Context, w *watcher, srv *flipServer, addr netip.Addr, ready bool) (sample, error) {
	if b.rules != nil {
		// The sample before this one (the built-in side's) has just made the dataplane sync,
		// and the decisive probe may come at any moment of its period after the flip, within
		// kube-proxy's minSyncPeriod of that sync too (then the change waits out the rest of
		// it: up to 100 ms added to about a tenth of the samples, found in the quiet run of
		// 2026-12-06, development/BENCHMARKS-HISTORY.md). The same pause as the built-in
		// side's (kcmSample) lets each side meet a dataplane that is free to sync.
		time.Sleep(b.rules.idle())
	}
	ev := w.expect("agent", addr, ready)
	rule, err := b.expectRule(ctx, w.ns+"/agent", addr, ready)
	if err != nil {
		return sample{}, err
	}
	flipped := srv.flip(addr, ready)
	got, err := ev.wait(ctx, b.o.waitTimeout)
	if err != nil {
		return sample{}, fmt.Errorf("%s ready=%v: %w", addr, ready, errors.Join(err, b.agent.Err()))
	}
	decisive := srv.decisive(addr)
	if decisive.IsZero() {
		return sample{}, fmt.Errorf("%s ready=%v: the slice changed before any probe saw the flip", addr, ready)
	}
	s := sample{start: decisive, addr: addr, latency: got.Sub(decisive), phase: decisive.Sub(flipped), ready: ready}
	if s.rules, err = b.waitRule(ctx, rule, decisive); err != nil {
		return sample{}, fmt.Errorf("%s ready=%v: %w", addr, ready, err)
	}
	return s, nil
}

// expectRule registers with the dataplane's rule watch (nil without -dataplane) what the next
// rule of the Service must show.
func (b *bench) expectRule(ctx context.Context, service string, addr netip.Addr, in bool) (ruleExpectation, error) {
	if b.rules == nil {
		return nil, nil
	}
	return b.rules.expect(ctx, service, addr, in)
}

// waitRule waits for the expected rule and returns its time since start (0 without -dataplane).
func (b *bench) waitRule(ctx context.Context, e ruleExpectation, start time.Time) (time.Duration, error) {
	if e == nil {
		return 0, nil
	}
	at, err := e.wait(ctx, b.o.waitTimeout)
	if err != nil {
		return 0, err
	}
	return at.Sub(start), nil
}

// kcmSample flips pod i's Ready condition and measures from the start of the kubelet's writes
// (statusPods.setReady) to the watch event.
func (b *bench) kcmSample(ctx context.Context, w *watcher, pods *statusPods, i int, ready bool) (sample, error) {
	if b.rules != nil {
		// kube-proxy syncs at most once per minSyncPeriod: the agent's sample just made it
		// sync, and a change arriving now would wait out the rest of that period; Cilium takes
		// in changes on a 500 ms tick, which the agent's sample just ended after. This pause
		// gives the built-in side a dataplane free to sync (ruleWatch.idle), as agentSample's
		// gives the agent's side.
		time.Sleep(b.rules.idle())
	}
	ev := w.expect("builtin", pods.ips[i], ready)
	rule, err := b.expectRule(ctx, w.ns+"/builtin", pods.ips[i], ready)
	if err != nil {
		return sample{}, err
	}
	start := time.Now()
	get, err := pods.setReady(ctx, i, ready)
	if err != nil {
		return sample{}, err
	}
	rtt := time.Since(start)
	got, err := ev.wait(ctx, b.o.waitTimeout)
	if err != nil {
		return sample{}, fmt.Errorf("%s ready=%v: %w", pods.ips[i], ready, errors.Join(err, b.kcm.Err()))
	}
	s := sample{start: start, addr: pods.ips[i], latency: got.Sub(start), phase: rtt, get: get, ready: ready}
	if s.rules, err = b.waitRule(ctx, rule, start); err != nil {
		return sample{}, fmt.Errorf("%s ready=%v: %w", pods.ips[i], ready, err)
	}
	return s, nil
}

// flipServer is one HTTP server per listener that answers 200 or 500 per local address and
// records when the first request after a flip arrived (the decisive probe).
type flipServer struct {
	mu    sync.Mutex
	addrs map[netip.Addr]*addrState
	srvs  []*http.Server
}

type addrState struct {
	healthy  bool
	pending  bool      // flipped, no request seen since
	decisive time.Time // arrival of the first request after the last flip
}

func newFlipServer() *flipServer { return &flipServer{addrs: map[netip.Addr]*addrState{}} }

func (f *flipServer) track(ips []netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ip := range ips {
		f.addrs[ip] = &addrState{healthy: true}
	}
}

// listen must run inside the pods' network namespace (InNetns); serving goes on outside it.
func (f *flipServer) listen(addr string) error {
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	s := &http.Server{Handler: http.HandlerFunc(f.serveHTTP), ReadHeaderTimeout: 10 * time.Second}
	s.SetKeepAlivesEnabled(false)
	f.mu.Lock()
	f.srvs = append(f.srvs, s)
	f.mu.Unlock()
	go func() { _ = s.Serve(ln) }()
	return nil
}

func (f *flipServer) serveHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	ap, err := netip.ParseAddrPort(fmt.Sprint(local))
	code := http.StatusMisdirectedRequest
	if err == nil {
		f.mu.Lock()
		if st, ok := f.addrs[ap.Addr().Unmap()]; ok {
			if st.pending {
				st.pending, st.decisive = false, now
			}
			code = http.StatusOK
			if !st.healthy {
				code = http.StatusInternalServerError
			}
		}
		f.mu.Unlock()
	}
	w.WriteHeader(code)
}

// flip sets addr's answer and returns the time of the flip.
func (f *flipServer) flip(addr netip.Addr, healthy bool) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.addrs[addr]
	st.healthy, st.pending, st.decisive = healthy, true, time.Time{}
	return time.Now()
}

func (f *flipServer) decisive(addr netip.Addr) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addrs[addr].decisive
}

func (f *flipServer) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.srvs {
		_ = s.Close()
	}
}

// statusPods are Pod objects for the built-in controller, whose Ready condition the benchmark
// flips through the status subresource (what a kubelet does after a decisive readiness probe).
type statusPods struct {
	cs     kubernetes.Interface
	write  string // builtinWriteKubelet or builtinWriteUpdate
	ns     string
	labels map[string]string
	pods   []*cluster.Pod
	objs   []*corev1.Pod
	ips    []netip.Addr
}

func newStatusPods(ctx context.Context, c *cluster.Cluster, cs kubernetes.Interface, write, ns string, n int) (*statusPods, error) {
	sp := &statusPods{cs: cs, write: write, ns: ns, labels: map[string]string{"app": "builtin-" + strconv.Itoa(n)}}
	sp.pods, sp.objs = make([]*cluster.Pod, n), make([]*corev1.Pod, n)
	err := parallel(ctx, n, 16, func(ctx context.Context, i int) error {
		p, err := c.NewPod(ctx, cluster.PodSpec{Namespace: ns, Name: fmt.Sprintf("builtin-%d", i), Node: kcmNode, Labels: sp.labels, ObjectOnly: true})
		if err != nil {
			return err
		}
		sp.pods[i] = p
		obj, err := p.Object(ctx)
		if err != nil {
			return err
		}
		sp.objs[i] = obj
		return nil
	})
	sp.ips = make([]netip.Addr, 0, n)
	for _, p := range sp.pods {
		if p != nil {
			sp.ips = append(sp.ips, p.IP)
		}
	}
	if err != nil {
		sp.remove()
		return nil, err
	}
	return sp, nil
}

// The built-in side's status writes (-builtin-write).
const (
	// builtinWriteKubelet writes as the kubelet's status manager does after a readiness change
	// (pkg/kubelet/status, syncPod): it reads the pod from the API server, then sends a
	// strategic merge patch of the status subresource, computed from the read status and the
	// new one, carrying the pod's UID as a precondition (pkg/util/pod, PatchPodStatus).
	builtinWriteKubelet = "kubelet"
	// builtinWriteUpdate sends one status update of the benchmark's own copy: less than a
	// kubelet does, so a lower bound of the built-in path (the measurements before 2026-12-02 13:00 UTC).
	builtinWriteUpdate = "update"
)

// setReady writes pod i's Ready and ContainersReady conditions and its container's ready flag
// as sp.write says, and returns how long the kubelet's GET took (0 for a plain update).
func (sp *statusPods) setReady(ctx context.Context, i int, ready bool) (time.Duration, error) {
	pods := sp.cs.CoreV1().Pods(sp.ns)
	name := sp.objs[i].Name
	if sp.write == builtinWriteUpdate { // the benchmark is the only writer, so its last copy is current
		pod := sp.objs[i].DeepCopy()
		pod.Status = flippedStatus(pod.Status, ready)
		updated, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		if err != nil {
			return 0, fmt.Errorf("updating the status of pod %s: %w", name, err)
		}
		sp.objs[i] = updated
		return 0, nil
	}
	start := time.Now()
	cur, err := pods.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("reading pod %s: %w", name, err)
	}
	get := time.Since(start)
	patch, err := statusPatch(cur, flippedStatus(cur.Status, ready))
	if err != nil {
		return get, fmt.Errorf("pod %s: %w", name, err)
	}
	if _, err := pods.Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return get, fmt.Errorf("patching the status of pod %s: %w", name, err)
	}
	return get, nil
}

// flippedStatus is status with the Ready and ContainersReady conditions and the containers'
// ready flags set to ready, the conditions' transition time now.
func flippedStatus(status corev1.PodStatus, ready bool) corev1.PodStatus {
	out := *status.DeepCopy()
	cond := corev1.ConditionFalse
	if ready {
		cond = corev1.ConditionTrue
	}
	now := metav1.Now()
	for j := range out.Conditions {
		if t := out.Conditions[j].Type; t == corev1.PodReady || t == corev1.ContainersReady {
			out.Conditions[j].Status, out.Conditions[j].LastTransitionTime = cond, now
		}
	}
	for j := range out.ContainerStatuses {
		out.ContainerStatuses[j].Ready = ready
	}
	return out
}

// statusPatch is the kubelet's patch from pod's status to status: a two-way strategic merge
// patch of the JSON of two pods holding only the statuses, the new one also the UID, which
// the patch thereby carries as a precondition.
func statusPatch(pod *corev1.Pod, status corev1.PodStatus) ([]byte, error) {
	before, err := json.Marshal(corev1.Pod{Status: pod.Status})
	if err != nil {
		return nil, fmt.Errorf("encoding the status: %w", err)
	}
	after, err := json.Marshal(corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: pod.UID}, Status: status})
	if err != nil {
		return nil, fmt.Errorf("encoding the new status: %w", err)
	}
	patch, err := strategicpatch.CreateTwoWayMergePatch(before, after, corev1.Pod{})
	if err != nil {
		return nil, fmt.Errorf("the status patch: %w", err)
	}
	return patch, nil
}

func (sp *statusPods) remove() {
	_ = parallel(context.Background(), len(sp.pods), 16, func(ctx context.Context, i int) error {
		if sp.pods[i] != nil {
			return sp.pods[i].Remove(ctx)
		}
		return nil
	})
}

func parallel(ctx context.Context, n, workers int, fn func(context.Context, int) error) error {
	idx := make(chan int)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range idx {
				if err := fn(ctx, i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		idx <- i
	}
	close(idx)
	wg.Wait()
	if len(errs) > 3 {
		errs = append(errs[:3], fmt.Errorf("and %d more errors", len(errs)-3))
	}
	return errors.Join(errs...)
}

// watcher is an EndpointSlice informer for one namespace; its handler stamps the moment an
// expected endpoint state shows up.
type watcher struct {
	ns       string
	cancel   context.CancelFunc
	informer cache.SharedIndexInformer
	mu       sync.Mutex
	want     map[string]*expectation // by service name
}

type expectation struct {
	service string
	addr    string
	ready   bool
	seen    chan time.Time
}

func newWatcher(ctx context.Context, cs kubernetes.Interface, ns string) (*watcher, error) {
	ctx, cancel := context.WithCancel(ctx)
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	w := &watcher{ns: ns, cancel: cancel, informer: f.Discovery().V1().EndpointSlices().Informer(), want: map[string]*expectation{}}
	if _, err := w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.observe,
		UpdateFunc: func(_, obj any) { w.observe(obj) },
	}); err != nil {
		cancel()
		return nil, fmt.Errorf("EndpointSlice informer: %w", err)
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			cancel()
			return nil, fmt.Errorf("informer for %v did not sync", typ)
		}
	}
	return w, nil
}

func (w *watcher) stop() { w.cancel() }

func (w *watcher) observe(obj any) {
	now := time.Now()
	slice, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	svc := slice.Labels[discoveryv1.LabelServiceName]
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.want[svc]
	if e == nil {
		return
	}
	for _, ep := range slice.Endpoints {
		if len(ep.Addresses) > 0 && ep.Addresses[0] == e.addr && isReady(ep) == e.ready {
			delete(w.want, svc)
			e.seen <- now
			return
		}
	}
}

func isReady(ep discoveryv1.Endpoint) bool {
	return ep.Conditions.Ready == nil || *ep.Conditions.Ready
}

// expect registers what the next watch event of the service's slices must show.
func (w *watcher) expect(service string, addr netip.Addr, ready bool) *expectation {
	e := &expectation{service: service, addr: addr.String(), ready: ready, seen: make(chan time.Time, 1)}
	w.mu.Lock()
	w.want[service] = e
	w.mu.Unlock()
	return e
}

func (e *expectation) wait(ctx context.Context, timeout time.Duration) (time.Time, error) {
	select {
	case t := <-e.seen:
		return t, nil
	case <-time.After(timeout):
		return time.Time{}, fmt.Errorf("no watch event with the endpoint ready=%v within %s: %w", e.ready, timeout, errTimeout)
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}

// waitAllReady waits until the service's slices list every address as ready.
func (w *watcher) waitAllReady(ctx context.Context, service string, ips []netip.Addr, timeout time.Duration, p *process.Process) error {
	deadline := time.Now().Add(timeout)
	for {
		ready := map[string]bool{}
		for _, obj := range w.informer.GetStore().List() {
			s := obj.(*discoveryv1.EndpointSlice)
			if s.Labels[discoveryv1.LabelServiceName] != service {
				continue
			}
			for _, ep := range s.Endpoints {
				if isReady(ep) && len(ep.Addresses) > 0 {
					ready[ep.Addresses[0]] = true
				}
			}
		}
		missing := 0
		for _, ip := range ips {
			if !ready[ip.String()] {
				missing++
			}
		}
		if missing == 0 {
			return nil
		}
		if err := p.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d endpoints not ready after %s: %w", missing, len(ips), timeout, errTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// slices counts the service's slices and their mean size as JSON (what one update of one of
// them sends to every watcher, kube-proxies included).
func (w *watcher) slices(service string) (n, meanBytes int) {
	total := 0
	for _, obj := range w.informer.GetStore().List() {
		s := obj.(*discoveryv1.EndpointSlice)
		if s.Labels[discoveryv1.LabelServiceName] != service {
			continue
		}
		n++
		if raw, err := json.Marshal(s); err == nil {
			total += len(raw)
		}
	}
	if n == 0 {
		return 0, 0
	}
	return n, total / n
}

// writeCost measures what the API server takes to update a copy of the service's first slice:
// the copy (another name, not managed by anybody, no owner) has one endpoint's ready flag
// flipped and is updated writes times; it returns the median round trip. This separates the
// API write from the rest of a reconcile. stripManagedFields writes the copy as the agent writes
// its slices (every update clears managedFields, so the API server tracks no fields after the
// first); without it, as kube-controller-manager writes (every update tracked).
func (b *bench) writeCost(ctx context.Context, w *watcher, service string, writes int, stripManagedFields bool) (time.Duration, error) {
	var src *discoveryv1.EndpointSlice
	for _, obj := range w.informer.GetStore().List() {
		if s := obj.(*discoveryv1.EndpointSlice); s.Labels[discoveryv1.LabelServiceName] == service {
			src = s
			break
		}
	}
	if src == nil {
		return 0, fmt.Errorf("no slice of %s", service)
	}
	cp := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: src.Namespace, GenerateName: "bench-copy-",
			Labels: map[string]string{discoveryv1.LabelServiceName: "bench-copy", discoveryv1.LabelManagedBy: "bench.invalid"},
		},
		AddressType: src.AddressType, Endpoints: src.DeepCopy().Endpoints, Ports: src.Ports,
	}
	api := b.cs.DiscoveryV1().EndpointSlices(src.Namespace)
	cp, err := api.Create(ctx, cp, metav1.CreateOptions{})
	if err != nil {
		return 0, fmt.Errorf("creating a copy of slice %s: %w", src.Name, err)
	}
	defer func() { _ = api.Delete(context.Background(), cp.Name, metav1.DeleteOptions{}) }()
	var rtts []time.Duration
	for range writes {
		ready := !isReady(cp.Endpoints[0])
		cp.Endpoints[0].Conditions.Ready = &ready
		if stripManagedFields {
			cp.ManagedFields = []metav1.ManagedFieldsEntry{{}}
		}
		start := time.Now()
		cp, err = api.Update(ctx, cp, metav1.UpdateOptions{})
		if err != nil {
			return 0, fmt.Errorf("updating the copy of slice %s: %w", src.Name, err)
		}
		rtts = append(rtts, time.Since(start))
	}
	return pct(rtts, 50), nil
}
