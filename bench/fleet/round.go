// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/loopback"
	"github.com/deckhouse/service-with-healthchecks/testkit/metrics"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

// result is what one round of one build measured; zero for phases not run.
type result struct {
	loadBefore, loadAfter string

	ready   time.Duration // controller start to /readyz
	synced  time.Duration // controller start to every fleet resource's status counting every node
	startUp time.Duration // controller CPU from its start to the end of the first settle
	// startPeak is the controller's peak RSS (VmHWM) at the end of the first settle: the initial
	// lists of the whole fleet, which a memory limit must hold.
	startPeak int64
	// settled is the controller's start to its counters staying flat (the audit's pass over
	// every slice included); startGETs and startAudits are its GET requests and slice audits
	// by then.
	settled                time.Duration
	startGETs, startAudits float64

	steady window // steady state
	stale  window // the same while the stale nodes stay stale

	withdrawn    time.Duration // last renewal of the stopped nodes to the last of their slices withdrawn
	staleStatus  time.Duration // the same, to every fleet resource saying EndpointsWithdrawn
	falseWithdrw int           // slices of live nodes seen withdrawn (0 unless the renewals fell behind)
	withdrawnCnt float64       // swh_controller_withdrawn_slices_total after the stale phase

	burst burst

	renewed, renewFailed int
	renewMaxLag          time.Duration
}

// window is a stretch of steady state.
type window struct {
	length        time.Duration
	cpu           time.Duration
	rss           int64
	heap          int64              // go_memstats_heap_inuse_bytes at its end: live objects and what the GC has not yet freed
	requests      map[string]float64 // the controller's own API requests by method
	writes        float64            // the controller's own writes (service and status) in the window
	reconciles    float64
	known, stales float64 // swh_controller_agents_known / agents_stale at its end
}

// burst is the resources created at once.
type burst struct {
	n          int
	creates    time.Duration // first create to the last create returned
	statuses   time.Duration // first create to every status set
	cpu        time.Duration
	rssAfter   int64
	peakRSS    int64
	heapAfter  int64 // go_memstats_heap_inuse_bytes once settled
	apiWrites  map[string]float64 // by the API server's count, leases and the benchmark's own creates left out
	requests   map[string]float64 // the controller's own, by method
	serviceW   float64
	statusW    float64
	reconciles float64
}

func (r result) String() string {
	return fmt.Sprintf("ready %s, synced %s, steady cpu %s rss %s, withdrawn %s (status %s, false %d), stale cpu %s, burst %d statuses %s cpu %s peak %s, renewals %d (failed %d, max lag %s)",
		dur(r.ready), dur(r.synced), dur(r.steady.cpu), mib(r.steady.rss), dur(r.withdrawn), dur(r.staleStatus), r.falseWithdrw,
		dur(r.stale.cpu), r.burst.n, dur(r.burst.statuses), dur(r.burst.cpu), mib(r.burst.peakRSS), r.renewed, r.renewFailed, dur(r.renewMaxLag))
}

func round(o options, bin string, args []string) (res result, err error) {
	res.loadBefore = process.LoadAvg()
	env, err := controlplane.Start(controlplane.Options{APIServerFlags: map[string]string{"service-cluster-ip-range": o.serviceCIDR}})
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, env.Stop()) }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := env.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: leaseNamespace}}); err != nil {
		return res, fmt.Errorf("creating the lease namespace: %w", err)
	}
	ns, err := env.CreateNamespace(ctx, "fleet")
	if err != nil {
		return res, err
	}
	burstNS, err := env.CreateNamespace(ctx, "burst")
	if err != nil {
		return res, err
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		return res, fmt.Errorf("clientset: %w", err)
	}
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		return res, fmt.Errorf("dynamic client: %w", err)
	}

	nodes, err := makeFleet(ctx, c, o, ns)
	if err != nil {
		return res, err
	}
	ren, err := startRenewer(ctx, c, o, nodes)
	if err != nil {
		return res, err
	}
	defer ren.close()
	w, err := startWatcher(ctx, cs, dyn)
	if err != nil {
		return res, err
	}
	stale := make([]int, o.stale)
	staleNodes := map[string]bool{}
	for i := range stale {
		stale[i] = i
		staleNodes[nodeName(i)] = true
	}
	// Withdrawn slices of nodes that never stop renewing: the renewals fell behind the grace.
	falseWithdrawals := w.expect("false withdrawals", "slice", math.MaxInt, func(obj any) bool {
		s := obj.(*discoveryv1.EndpointSlice)
		return !staleNodes[slicemeta.NodeOf(s)] && withdrawn(s)
	})

	dir, err := os.MkdirTemp("", "swh-bench-fleet-")
	if err != nil {
		return res, fmt.Errorf("temporary directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	kubeconfig, err := env.WriteKubeConfig(dir)
	if err != nil {
		return res, err
	}
	addrs, err := loopback.FreeAddrs(2)
	if err != nil {
		return res, err
	}
	metricsAddr, healthAddr := addrs[0], addrs[1]
	cmdArgs := append([]string{"--kubeconfig", kubeconfig, "--leader-elect=false",
		"--metrics-bind-address", metricsAddr, "--health-probe-bind-address", healthAddr, "--log-level", "error",
		"--agent-lease-namespace", leaseNamespace, "--agent-lost-grace", o.grace.String()}, args...)
	cmd := exec.Command(bin, cmdArgs...) //nolint:gosec // our own build
	cmd.Env = append(os.Environ(), "KUBECONFIG=")
	synced := w.expect("every fleet resource counts every node", "resource", o.resources, func(obj any) bool {
		swh := obj.(*v1alpha1.ServiceWithHealthchecks)
		return swh.Namespace == ns && endpoints(swh, o.nodes, o.nodes) &&
			conditionIs(swh, v1alpha1.ConditionServiceSynced, metav1.ConditionTrue, "") &&
			conditionIs(swh, v1alpha1.ConditionAgentsStale, metav1.ConditionFalse, "")
	})
	p, err := process.Start("the controller", cmd, process.Options{LogFile: filepath.Join(dir, "controller.log")})
	if err != nil {
		return res, err
	}
	defer func() {
		err = errors.Join(err, p.Stop())
		if err != nil {
			fmt.Fprintf(os.Stderr, "controller output:\n%s\n", p.Output(4000))
		}
	}()
	exited := func() error { return fmt.Errorf("the controller exited: %s", p.ExitText()) }
	phaseCtx := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, o.timeout) }

	pctx, pcancel := phaseCtx()
	defer pcancel()
	if err := p.WaitHTTP(pctx, "http://"+healthAddr+"/readyz"); err != nil {
		return res, fmt.Errorf("waiting for the controller to be ready: %w", err)
	}
	res.ready = time.Since(p.Started())
	last, err := w.wait(pctx, synced, p.Done(), exited)
	if err != nil {
		return res, err
	}
	res.synced = last.Sub(p.Started())
	settled, err := settle(pctx, metricsAddr, o.settle)
	if err != nil {
		return res, err
	}
	// The audit of published endpoints reads each audited slice's node's Pods (one uncached
	// LIST, development/CONTROLLER.md): its pass over the whole fleet is most of the start-up's
	// GETs and ends with the settle.
	res.settled = time.Since(p.Started()) - o.settle
	res.startGETs = requestsByMethod(nil, settled)["GET"]
	res.startAudits = settled.Sum("swh_controller_audited_endpointslices_total", nil)
	if res.startUp, err = process.CPUTime(p.PID()); err != nil {
		return res, err
	}
	if res.startPeak, err = process.PeakRSS(p.PID()); err != nil {
		return res, err
	}

	if o.phases[phaseSteady] {
		if res.steady, err = measure(ctx, p, metricsAddr, o.window); err != nil {
			return res, err
		}
	}

	if o.phases[phaseStale] && o.stale > 0 {
		pctx, pcancel := phaseCtx()
		defer pcancel()
		before, err := metrics.Get(pctx, metricsAddr)
		if err != nil {
			return res, err
		}
		gone := w.expect("every slice of the stale nodes withdrawn", "slice", o.stale*o.resources, func(obj any) bool {
			s := obj.(*discoveryv1.EndpointSlice)
			return s.Namespace == ns && staleNodes[slicemeta.NodeOf(s)] && withdrawn(s)
		})
		told := w.expect("every fleet resource says EndpointsWithdrawn", "resource", o.resources, func(obj any) bool {
			swh := obj.(*v1alpha1.ServiceWithHealthchecks)
			return swh.Namespace == ns && endpoints(swh, o.nodes-o.stale, o.nodes) &&
				conditionIs(swh, v1alpha1.ConditionAgentsStale, metav1.ConditionTrue, "EndpointsWithdrawn")
		})
		lastRenewal := ren.stop(stale)
		at, err := w.wait(pctx, gone, p.Done(), exited)
		if err != nil {
			return res, err
		}
		res.withdrawn = at.Sub(lastRenewal)
		if at, err = w.wait(pctx, told, p.Done(), exited); err != nil {
			return res, err
		}
		res.staleStatus = at.Sub(lastRenewal)
		after, err := settle(pctx, metricsAddr, o.settle)
		if err != nil {
			return res, err
		}
		res.withdrawnCnt = after.Sum("swh_controller_withdrawn_slices_total", nil) - before.Sum("swh_controller_withdrawn_slices_total", nil)
		if o.staleWindow > 0 {
			if res.stale, err = measure(ctx, p, metricsAddr, o.staleWindow); err != nil {
				return res, err
			}
		}
		// The agents return: Leases renewed, slices republished ready.
		back := w.expect("every fleet resource counts every node again", "resource", o.resources, func(obj any) bool {
			swh := obj.(*v1alpha1.ServiceWithHealthchecks)
			return swh.Namespace == ns && endpoints(swh, o.nodes, o.nodes) &&
				conditionIs(swh, v1alpha1.ConditionAgentsStale, metav1.ConditionFalse, "")
		})
		if err := ren.resume(ctx, stale); err != nil {
			return res, err
		}
		if err := republish(pctx, c, o, ns, stale); err != nil {
			return res, err
		}
		if _, err := w.wait(pctx, back, p.Done(), exited); err != nil {
			return res, err
		}
		if _, err := settle(pctx, metricsAddr, o.settle); err != nil {
			return res, err
		}
	}
	w.mu.Lock()
	res.falseWithdrw = len(falseWithdrawals.at)
	w.mu.Unlock()

	if o.phases[phaseBurst] && o.burst > 0 {
		if res.burst, err = runBurst(ctx, o, env, cs, w, p, metricsAddr, burstNS); err != nil {
			return res, err
		}
	}
	res.renewed, res.renewFailed, res.renewMaxLag = ren.stats()
	res.loadAfter = process.LoadAvg()
	return res, nil
}

// measure is a steady-state window: the controller's CPU over it, its RSS at its end, and what
// it asked of the API server meanwhile.
func measure(ctx context.Context, p *process.Process, metricsAddr string, length time.Duration) (window, error) {
	win := window{length: length}
	before, err := metrics.Get(ctx, metricsAddr)
	if err != nil {
		return win, err
	}
	cpu0, err := process.CPUTime(p.PID())
	if err != nil {
		return win, err
	}
	select {
	case <-time.After(length): // the measuring window itself, not a synchronisation
	case <-p.Done():
		return win, fmt.Errorf("the controller exited: %s", p.ExitText())
	}
	cpu1, err := process.CPUTime(p.PID())
	if err != nil {
		return win, err
	}
	after, err := metrics.Get(ctx, metricsAddr)
	if err != nil {
		return win, err
	}
	win.cpu = cpu1 - cpu0
	if win.rss, err = process.RSS(p.PID()); err != nil {
		return win, err
	}
	win.heap = int64(after.Sum("go_memstats_heap_inuse_bytes", nil))
	win.requests = requestsByMethod(before, after)
	win.writes = delta(before, after, "swh_controller_service_writes_total") + delta(before, after, "swh_controller_status_writes_total")
	win.reconciles = delta(before, after, "swh_controller_reconciles_total")
	win.known = after.Sum("swh_controller_agents_known", nil)
	win.stales = after.Sum("swh_controller_agents_stale", nil)
	return win, nil
}

// runBurst creates o.burst resources at once in ns and waits until every status is set.
func runBurst(ctx context.Context, o options, env *controlplane.Env, cs kubernetes.Interface, w *watcher, p *process.Process,
	metricsAddr, ns string) (burst, error) {
	b := burst{n: o.burst}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	apiBefore, err := apiRequests(ctx, cs)
	if err != nil {
		return b, err
	}
	before, err := metrics.Get(ctx, metricsAddr)
	if err != nil {
		return b, err
	}
	cpu0, err := process.CPUTime(p.PID())
	if err != nil {
		return b, err
	}
	set := w.expect("every status of the burst set", "resource", o.burst, func(obj any) bool {
		swh := obj.(*v1alpha1.ServiceWithHealthchecks)
		return swh.Namespace == ns && swh.Status.ObservedGeneration == swh.Generation &&
			conditionIs(swh, v1alpha1.ConditionServiceSynced, metav1.ConditionTrue, "")
	})
	t0 := time.Now()
	if err := parallel(o.burst, o.writers, func(i int) error {
		r := resource(ns, burstName(i))
		if err := env.Client.Create(ctx, r); err != nil {
			return fmt.Errorf("creating %s: %w", r.Name, err)
		}
		return nil
	}); err != nil {
		return b, err
	}
	b.creates = time.Since(t0)
	last, err := w.wait(ctx, set, p.Done(), func() error { return fmt.Errorf("the controller exited: %s", p.ExitText()) })
	if err != nil {
		return b, err
	}
	b.statuses = last.Sub(t0)
	after, err := settle(ctx, metricsAddr, o.settle)
	if err != nil {
		return b, err
	}
	cpu1, err := process.CPUTime(p.PID())
	if err != nil {
		return b, err
	}
	apiAfter, err := apiRequests(ctx, cs)
	if err != nil {
		return b, err
	}
	b.cpu = cpu1 - cpu0
	if b.rssAfter, err = process.RSS(p.PID()); err != nil {
		return b, err
	}
	if b.peakRSS, err = process.PeakRSS(p.PID()); err != nil {
		return b, err
	}
	b.heapAfter = int64(after.Sum("go_memstats_heap_inuse_bytes", nil))
	b.apiWrites = map[string]float64{}
	for k, v := range apiAfter {
		if d := v - apiBefore[k]; d > 0 {
			b.apiWrites[k] = d
		}
	}
	// The benchmark's own creates are not the controller's.
	if b.apiWrites["POST servicewithhealthchecks"] -= float64(o.burst); b.apiWrites["POST servicewithhealthchecks"] <= 0 {
		delete(b.apiWrites, "POST servicewithhealthchecks")
	}
	b.requests = requestsByMethod(before, after)
	b.serviceW = delta(before, after, "swh_controller_service_writes_total")
	b.statusW = delta(before, after, "swh_controller_status_writes_total")
	b.reconciles = delta(before, after, "swh_controller_reconciles_total")
	return b, nil
}

func delta(before, after metrics.Families, name string) float64 {
	return after.Sum(name, nil) - before.Sum(name, nil)
}

// requestsByMethod is the controller's own requests to the API server between two scrapes, by
// method (client-go's rest_client_requests_total, which controller-runtime serves).
func requestsByMethod(before, after metrics.Families) map[string]float64 {
	out := map[string]float64{}
	for _, s := range after.Samples("rest_client_requests_total") {
		m := s.Labels["method"]
		out[m] += s.Value
	}
	for _, s := range before.Samples("rest_client_requests_total") {
		out[s.Labels["method"]] -= s.Value
	}
	for m, v := range out {
		if v <= 0 {
			delete(out, m)
		}
	}
	return out
}

// settle waits until the controller's own counters (swh_controller_*, durations aside) stay
// flat for quiet and returns its metrics then.
func settle(ctx context.Context, metricsAddr string, quiet time.Duration) (metrics.Families, error) {
	key := func(fams metrics.Families) string {
		var parts []string
		for name := range fams {
			if strings.HasPrefix(name, "swh_controller_") && !strings.Contains(name, "duration") {
				for _, s := range fams.Samples(name) {
					parts = append(parts, fmt.Sprintf("%s%v=%g", name, s.Labels, s.Value))
				}
			}
		}
		sort.Strings(parts)
		return strings.Join(parts, ",")
	}
	last, err := metrics.Get(ctx, metricsAddr)
	if err != nil {
		return nil, err
	}
	since := time.Now()
	for time.Since(since) < quiet {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the controller's counters did not settle: %w", ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
		m, err := metrics.Get(ctx, metricsAddr)
		if err != nil {
			return nil, err
		}
		if key(m) != key(last) {
			since = time.Now()
		}
		last = m
	}
	return last, nil
}

// apiRequests reads the API server's apiserver_request_total and sums the requests other than
// watches, lists and everything about Leases (the simulated agents' renewals) by
// "VERB resource[/subresource]", with " (code)" for answers other than 2xx.
func apiRequests(ctx context.Context, cs kubernetes.Interface) (map[string]float64, error) {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	fams, err := metrics.Parse(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, s := range fams.Samples("apiserver_request_total") {
		l := s.Labels
		if l["verb"] == "WATCH" || l["verb"] == "LIST" || l["resource"] == "leases" {
			continue
		}
		key := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		if !strings.HasPrefix(l["code"], "2") {
			key += " (" + l["code"] + ")"
		}
		out[key] += s.Value
	}
	return out, nil
}

// writes sums the writes among requests by "VERB resource": not GETs, not the API server's own
// ClusterIP allocations.
func writes(reqs map[string]float64) float64 {
	var s float64
	for k, v := range reqs {
		verb, rest, _ := strings.Cut(k, " ")
		resource, _, _ := strings.Cut(rest, " ")
		if verb == "GET" || resource == "ipaddresses" {
			continue
		}
		s += v
	}
	return s
}
