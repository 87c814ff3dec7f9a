// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Command writes measures the API write economy of the agent and the controller (issue 11,
// benchmark 3): EndpointSlice and status writes per minute while 1 000 endpoints are stable
// (goal: none), and under a flap storm (100 endpoints changing every probe period) the writes
// per change and the API requests per second at the peak. Writes are counted on the API
// server's side (its /metrics apiserver_request_total, by verb, resource and subresource) and
// by the agent (swh_agent_endpointslice_writes_total).
//
// It runs the real agent and controller programs (built by run.sh) against a real API server in
// an isolated test cluster (testkit/cluster, root), with the pods as bulk pods: one network
// namespace holding every pod address, one HTTP server whose status is set per address. It
// prints a markdown section to stdout (bench/run.sh) and progress to stderr.
//
//	bench/writes/run.sh
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/loopback"
	"github.com/deckhouse/service-with-healthchecks/testkit/metrics"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

type options struct {
	agentBin, controllerBin string
	endpoints, flapping     int
	stable, storm           time.Duration
	rounds                  int
	slices                  int // the EndpointSlices that hold the endpoints (measured)
}

func main() {
	cluster.Isolate()
	var o options
	flag.StringVar(&o.agentBin, "agent", "", "the agent program (images/agent/cmd/agent)")
	flag.StringVar(&o.controllerBin, "controller", "", "the controller program (images/controller/cmd/controller)")
	flag.IntVar(&o.endpoints, "endpoints", 1000, "pods (endpoints) of the one resource, all on one node")
	flag.IntVar(&o.flapping, "flapping", 100, "endpoints that change every period during the flap storm")
	flag.DurationVar(&o.stable, "stable", time.Minute, "length of one stable window")
	flag.DurationVar(&o.storm, "storm", 30*time.Second, "length of one flap storm")
	flag.IntVar(&o.rounds, "rounds", 3, "stable windows and storms, in alternation")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "writes:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "writes: %s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

const (
	node     = "node-a"
	leaseNS  = "swh-leases"
	resource = "bench"
	podPort  = 8080
	period   = time.Second
)

func run(o options) (err error) {
	if o.agentBin == "" || o.controllerBin == "" {
		return errors.New("--agent and --controller are required (run.sh builds them)")
	}
	c, err := cluster.New(cluster.Options{Nodes: []cluster.Node{{Name: node, Zone: "zone-a"}}})
	if err != nil {
		return fmt.Errorf("starting the cluster: %w", err)
	}
	defer func() {
		if serr := c.Stop(); serr != nil {
			err = errors.Join(err, serr)
		}
		if left := cluster.Leftovers(); len(left) > 0 {
			logf("left over: %v", left)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	dir, err := os.MkdirTemp("", "swh-writes-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	kubeconfig, err := c.Env.WriteKubeConfig(dir)
	if err != nil {
		return err
	}
	if err := c.Env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: leaseNS}}); err != nil {
		return fmt.Errorf("creating the lease namespace: %w", err)
	}
	ns, err := c.Env.CreateNamespace(ctx, "writes")
	if err != nil {
		return err
	}

	logf("creating %d bulk pods", o.endpoints)
	bulk, err := c.NewBulkPods(ctx, cluster.BulkSpec{Namespace: ns, Node: node, Count: o.endpoints, Port: podPort, Labels: map[string]string{"app": resource}})
	if err != nil {
		return err
	}
	defer func() {
		if rerr := bulk.Remove(context.Background()); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()

	addrs, err := loopback.FreeAddrs(2)
	if err != nil {
		return err
	}
	agentMetrics, ctrlMetrics := addrs[0], addrs[1]
	stopAgent, err := start(dir, "agent", o.agentBin, "--node-name="+node, "--kubeconfig="+kubeconfig,
		"--metrics-bind-address="+agentMetrics, "--health-probe-bind-address=0", "--lease-namespace="+leaseNS)
	if err != nil {
		return err
	}
	defer stopAgent()
	stopCtrl, err := start(dir, "controller", o.controllerBin, "--kubeconfig="+kubeconfig, "--metrics-bind-address="+ctrlMetrics,
		"--health-probe-bind-address=0", "--leader-elect=false", "--agent-lease-namespace="+leaseNS)
	if err != nil {
		return err
	}
	defer stopCtrl()

	swh := &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: resource},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Ports:    []v1alpha1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(podPort)}},
			Selector: map[string]string{"app": resource},
			Type:     corev1.ServiceTypeClusterIP,
			Healthcheck: &v1alpha1.Healthcheck{InitialDelaySeconds: 0, PeriodSeconds: int32(period / time.Second), Probes: []v1alpha1.Probe{{
				Mode: v1alpha1.ProbeModeHTTP, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 1,
				HTTP: &v1alpha1.HTTPProbe{TargetPort: intstr.FromInt32(podPort), Path: "/healthz", Scheme: corev1.URISchemeHTTP},
			}}},
		},
	}
	if err := c.Env.Client.Create(ctx, swh); err != nil {
		return fmt.Errorf("creating the ServiceWithHealthchecks: %w", err)
	}
	apiMetrics, err := newScraper(c.Env.Config)
	if err != nil {
		return err
	}
	agent := &promScraper{addr: agentMetrics}

	var flap []int // spread over the slices
	for i := range o.flapping {
		flap = append(flap, i*o.endpoints/o.flapping)
	}
	var stables []stableResult
	var storms []stormResult
	for r := 1; r <= o.rounds; r++ {
		logf("round %d: waiting for %d ready endpoints and a quiet API", r, o.endpoints)
		nslices, err := waitReady(ctx, c, ns, o.endpoints)
		if err != nil {
			return err
		}
		o.slices = nslices
		if _, err := waitQuiet(ctx, apiMetrics); err != nil {
			return err
		}
		s, err := measureStable(ctx, o, apiMetrics, agent)
		if err != nil {
			return err
		}
		logf("round %d stable: %+v", r, s)
		stables = append(stables, s)
		st, err := measureStorm(ctx, o, bulk, flap, apiMetrics, agent)
		if err != nil {
			return err
		}
		logf("round %d storm: %+v", r, st)
		storms = append(storms, st)
	}
	report(o, stables, storms)
	return nil
}

// waitReady waits until the resource's slices hold n ready endpoints and returns how many
// slices hold them.
func waitReady(ctx context.Context, c *cluster.Cluster, ns string, n int) (int, error) {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var list discoveryv1.EndpointSliceList
		if err := c.Env.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{wellknown.LabelResource: resource}); err != nil {
			return 0, fmt.Errorf("listing slices: %w", err)
		}
		ready := 0
		for _, s := range list.Items {
			for _, ep := range s.Endpoints {
				if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
					ready++
				}
			}
		}
		if ready == n {
			return len(list.Items), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d of %d endpoints ready after 5 minutes", ready, n)
		}
		time.Sleep(time.Second)
	}
}

// notLease matches every request but the Lease renewals, which go on at their own pace.
func notLease(k reqKey) bool { return k.resource != "leases" }

// waitQuiet waits until no write but Lease renewals reaches the API server for 5 s (Events
// of a storm are posted for a while after it) and returns when the quiet began.
func waitQuiet(ctx context.Context, api *apiScraper) (time.Time, error) {
	deadline := time.Now().Add(5 * time.Minute)
	last, err := api.scrape(ctx)
	if err != nil {
		return time.Time{}, err
	}
	quietSince := time.Now()
	for time.Since(quietSince) < 5*time.Second {
		if time.Now().After(deadline) {
			return time.Time{}, errors.New("writes did not stop within 5 minutes")
		}
		time.Sleep(time.Second)
		cur, err := api.scrape(ctx)
		if err != nil {
			return time.Time{}, err
		}
		if cur.sub(last).writes(notLease) > 0 {
			quietSince = time.Now()
		}
		last = cur
	}
	return quietSince, nil
}

type stableResult struct {
	sliceWritesPerMin, statusWritesPerMin, otherWritesPerMin, agentSliceWritesPerMin, probesPerSec float64
	other                                                                                          string
}

func measureStable(ctx context.Context, o options, api *apiScraper, agent *promScraper) (stableResult, error) {
	a0, err := api.scrape(ctx)
	if err != nil {
		return stableResult{}, err
	}
	g0, err := agent.scrape(ctx)
	if err != nil {
		return stableResult{}, err
	}
	t0 := time.Now()
	time.Sleep(o.stable)
	a1, err := api.scrape(ctx)
	if err != nil {
		return stableResult{}, err
	}
	g1, err := agent.scrape(ctx)
	if err != nil {
		return stableResult{}, err
	}
	mins := time.Since(t0).Minutes()
	d := a1.sub(a0)
	other := func(k reqKey) bool { return !isSlice(k) && !isStatus(k) }
	return stableResult{
		sliceWritesPerMin:      d.writes(isSlice) / mins,
		statusWritesPerMin:     d.writes(isStatus) / mins,
		otherWritesPerMin:      d.writes(other) / mins,
		other:                  d.describe(other, mins),
		agentSliceWritesPerMin: (g1.Sum("swh_agent_endpointslice_writes_total", nil) - g0.Sum("swh_agent_endpointslice_writes_total", nil)) / mins,
		probesPerSec:           (g1.Sum("swh_agent_probe_results_total", nil) - g0.Sum("swh_agent_probe_results_total", nil)) / (mins * 60),
	}, nil
}

type stormResult struct {
	flips, changes, sliceWrites, agentSliceWrites, statusWrites, eventWrites float64
	perChange, statusPerChange, eventsPerChange                              float64
	peakReqPerSec, peakWritesPerSec, meanReqPerSec                           float64
	sliceWriteBytes                                                          float64
	drain                                                                    time.Duration
	writes                                                                   string
}

func measureStorm(ctx context.Context, o options, bulk *cluster.BulkPods, flap []int, api *apiScraper, agent *promScraper) (stormResult, error) {
	a0, err := api.scrape(ctx)
	if err != nil {
		return stormResult{}, err
	}
	g0, err := agent.scrape(ctx)
	if err != nil {
		return stormResult{}, err
	}
	b0, err := api.sliceBodyBytes(ctx)
	if err != nil {
		return stormResult{}, err
	}
	t0 := time.Now()
	var res stormResult
	// The flips run on their own ticker; the API server's counters are sampled meanwhile (a
	// scrape of its /metrics can take a second on a loaded machine).
	flipsDone := make(chan float64)
	go func() {
		n := 0.0
		ticker := time.NewTicker(period)
		defer ticker.Stop()
		for {
			for _, i := range flap {
				bulk.SetHealthy(i, !bulk.Healthy(i))
			}
			n += float64(len(flap))
			<-ticker.C
			if time.Since(t0) >= o.storm {
				flipsDone <- n
				return
			}
		}
	}()
	prev, prevAt := a0, t0
	for time.Since(t0) < o.storm {
		time.Sleep(period)
		cur, err := api.scrape(ctx)
		if err != nil {
			<-flipsDone
			return res, err
		}
		d := cur.sub(prev)
		secs := time.Since(prevAt).Seconds()
		res.peakReqPerSec = max(res.peakReqPerSec, d.requests(func(reqKey) bool { return true })/secs)
		res.peakWritesPerSec = max(res.peakWritesPerSec, d.writes(func(reqKey) bool { return true })/secs)
		prev, prevAt = cur, time.Now()
	}
	res.flips += <-flipsDone
	stormEnd := time.Now()
	res.meanReqPerSec = prev.sub(a0).requests(func(reqKey) bool { return true }) / stormEnd.Sub(t0).Seconds()
	// Back to healthy (these changes count too: they are in the agent's transitions), then
	// wait until every write the storm caused is done.
	for _, i := range flap {
		if !bulk.Healthy(i) {
			bulk.SetHealthy(i, true)
			res.flips++
		}
	}
	quiet, err := waitQuiet(ctx, api)
	if err != nil {
		return res, err
	}
	res.drain = max(quiet.Sub(stormEnd), 0)
	a1, err := api.scrape(ctx)
	if err != nil {
		return res, err
	}
	g1, err := agent.scrape(ctx)
	if err != nil {
		return res, err
	}
	b1, err := api.sliceBodyBytes(ctx)
	if err != nil {
		return res, err
	}
	if n := b1[1] - b0[1]; n > 0 {
		res.sliceWriteBytes = (b1[0] - b0[0]) / n
	}
	d := a1.sub(a0)
	res.sliceWrites = d.writes(isSlice)
	res.statusWrites = d.writes(isStatus)
	res.eventWrites = d.writes(func(k reqKey) bool { return k.resource == "events" })
	res.agentSliceWrites = g1.Sum("swh_agent_endpointslice_writes_total", nil) - g0.Sum("swh_agent_endpointslice_writes_total", nil)
	res.changes = g1.Sum("swh_agent_probe_transitions_total", nil) - g0.Sum("swh_agent_probe_transitions_total", nil)
	res.writes = d.describe(func(reqKey) bool { return true }, time.Since(t0).Minutes())
	if res.changes > 0 {
		res.perChange = res.sliceWrites / res.changes
		res.statusPerChange = res.statusWrites / res.changes
		res.eventsPerChange = res.eventWrites / res.changes
	}
	return res, nil
}

func report(o options, stables []stableResult, storms []stormResult) {
	medS := func(f func(stableResult) float64) string {
		var vs []float64
		for _, s := range stables {
			vs = append(vs, f(s))
		}
		return median(vs)
	}
	medT := func(f func(stormResult) float64) string {
		var vs []float64
		for _, s := range storms {
			vs = append(vs, f(s))
		}
		return median(vs)
	}
	fmt.Printf("## API write economy (bench/writes)\n\n")
	fmt.Printf("One resource, one HTTP probe every %s (thresholds 1/1), %d endpoints on one node, real agent and controller\n", period, o.endpoints)
	fmt.Printf("programs, real API server; writes counted by the API server (apiserver_request_total) and by the agent.\n")
	fmt.Printf("The endpoints are published in %d EndpointSlices. ", o.slices)
	fmt.Printf("Medians of %d stable windows of %s and %d flap storms of %s (%d endpoints flipped every period).\n\n", len(stables), o.stable, len(storms), o.storm, o.flapping)
	fmt.Printf("| stable, %d endpoints | per minute |\n| --- | ---: |\n", o.endpoints)
	fmt.Printf("| EndpointSlice writes (API server) | %s |\n", medS(func(s stableResult) float64 { return s.sliceWritesPerMin }))
	fmt.Printf("| EndpointSlice writes (agent) | %s |\n", medS(func(s stableResult) float64 { return s.agentSliceWritesPerMin }))
	fmt.Printf("| ServiceWithHealthchecks status writes | %s |\n", medS(func(s stableResult) float64 { return s.statusWritesPerMin }))
	fmt.Printf("| other writes (Leases, Events, ...) | %s |\n", medS(func(s stableResult) float64 { return s.otherWritesPerMin }))
	fmt.Printf("| probes run (per second) | %s |\n\n", medS(func(s stableResult) float64 { return s.probesPerSec }))
	if len(stables) > 0 {
		fmt.Printf("Other writes in the last stable window: %s.\n\n", stables[len(stables)-1].other)
	}
	fmt.Printf("| flap storm, %d of %d endpoints every period | value |\n| --- | ---: |\n", o.flapping, o.endpoints)
	fmt.Printf("| flips made (the storm and the return to healthy) | %s |\n", medT(func(s stormResult) float64 { return s.flips }))
	fmt.Printf("| result changes seen by the agent | %s |\n", medT(func(s stormResult) float64 { return s.changes }))
	fmt.Printf("| EndpointSlice writes (API server) | %s |\n", medT(func(s stormResult) float64 { return s.sliceWrites }))
	fmt.Printf("| EndpointSlice writes (agent) | %s |\n", medT(func(s stormResult) float64 { return s.agentSliceWrites }))
	fmt.Printf("| EndpointSlice writes per change | %s |\n", medT(func(s stormResult) float64 { return s.perChange }))
	fmt.Printf("| bytes per EndpointSlice update (mean body size) | %s |\n", medT(func(s stormResult) float64 { return s.sliceWriteBytes }))
	fmt.Printf("| status writes | %s |\n", medT(func(s stormResult) float64 { return s.statusWrites }))
	fmt.Printf("| status writes per change | %s |\n", medT(func(s stormResult) float64 { return s.statusPerChange }))
	fmt.Printf("| Event writes | %s |\n", medT(func(s stormResult) float64 { return s.eventWrites }))
	fmt.Printf("| Event writes per change | %s |\n", medT(func(s stormResult) float64 { return s.eventsPerChange }))
	fmt.Printf("| seconds until the writes stop after the storm | %s |\n", medT(func(s stormResult) float64 { return s.drain.Seconds() }))
	fmt.Printf("| API requests per second, peak second | %s |\n", medT(func(s stormResult) float64 { return s.peakReqPerSec }))
	fmt.Printf("| API writes per second, peak second | %s |\n", medT(func(s stormResult) float64 { return s.peakWritesPerSec }))
	fmt.Printf("| API requests per second, mean | %s |\n", medT(func(s stormResult) float64 { return s.meanReqPerSec }))
	if len(storms) > 0 {
		fmt.Printf("\nWrites of the last storm, from its start until the writes stopped (per minute): %s.\n", storms[len(storms)-1].writes)
	}
}

func median(vs []float64) string {
	if len(vs) == 0 {
		return "-"
	}
	slices.Sort(vs)
	return strconv.FormatFloat(vs[(len(vs)-1)/2], 'g', 4, 64)
}

// start runs a program with its output in a log file; the returned function stops it by PID
// (SIGTERM, SIGKILL after 30 s) and, with WRITES_LOGS=1, prints its log.
func start(dir, name, bin string, args ...string) (func(), error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG=")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logPath := filepath.Join(dir, name+".log")
	p, err := process.Start("the "+name, cmd, process.Options{LogFile: logPath})
	if err != nil {
		return nil, err
	}
	return func() {
		_ = p.Stop()
		if os.Getenv("WRITES_LOGS") == "1" {
			if b, err := os.ReadFile(logPath); err == nil {
				fmt.Fprintf(os.Stderr, "--- %s log:\n%s\n", name, b)
			}
		}
	}, nil
}

// reqKey is one series of apiserver_request_total, summed over codes and scopes.
type reqKey struct{ verb, group, resource, subresource string }

var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "DELETE": true, "DELETECOLLECTION": true, "APPLY": true}

func isSlice(k reqKey) bool { return k.resource == "endpointslices" }
func isStatus(k reqKey) bool {
	return k.resource == "servicewithhealthchecks" && k.subresource == "status"
}

type counts map[reqKey]float64

func (c counts) sub(o counts) counts {
	d := counts{}
	for k, v := range c {
		d[k] = v - o[k]
	}
	return d
}

// writes sums write requests of the resources that match (requests without a resource, such as
// our own /metrics scrapes, never count).
func (c counts) writes(match func(reqKey) bool) float64 {
	n := 0.0
	for k, v := range c {
		if k.resource != "" && writeVerbs[k.verb] && match(k) {
			n += v
		}
	}
	return n
}

func (c counts) requests(match func(reqKey) bool) float64 {
	n := 0.0
	for k, v := range c {
		if k.resource != "" && match(k) {
			n += v
		}
	}
	return n
}

func (c counts) describe(match func(reqKey) bool, mins float64) string {
	var parts []string
	for k, v := range c {
		if k.resource != "" && writeVerbs[k.verb] && match(k) && v > 0 {
			r := k.resource
			if k.subresource != "" {
				r += "/" + k.subresource
			}
			parts = append(parts, fmt.Sprintf("%s %s %.3g/min", k.verb, r, v/mins))
		}
	}
	slices.Sort(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// apiScraper reads the API server's apiserver_request_total.
type apiScraper struct {
	url string
	hc  *http.Client
}

func newScraper(cfg *rest.Config) (*apiScraper, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("API server client: %w", err)
	}
	return &apiScraper{url: strings.TrimSuffix(cfg.Host, "/") + "/metrics", hc: hc}, nil
}

func (a *apiScraper) scrape(ctx context.Context) (counts, error) {
	fams, err := metrics.Scrape(ctx, a.hc, a.url)
	if err != nil {
		return nil, err
	}
	out := counts{}
	for _, s := range fams.Samples("apiserver_request_total") {
		l := s.Labels
		out[reqKey{verb: l["verb"], group: l["group"], resource: l["resource"], subresource: l["subresource"]}] += s.Value
	}
	return out, nil
}

// sliceBodyBytes returns the sum and the count of apiserver_request_body_size_bytes for
// EndpointSlice updates.
func (a *apiScraper) sliceBodyBytes(ctx context.Context) ([2]float64, error) {
	fams, err := metrics.Scrape(ctx, a.hc, a.url)
	if err != nil {
		return [2]float64{}, err
	}
	updates := map[string]string{"resource": "endpointslices", "verb": "update"}
	return [2]float64{
		fams.Sum("apiserver_request_body_size_bytes_sum", updates),
		fams.Sum("apiserver_request_body_size_bytes_count", updates),
	}, nil
}

// promScraper reads a program's /metrics.
type promScraper struct{ addr string }

func (p *promScraper) scrape(ctx context.Context) (metrics.Families, error) {
	return metrics.Get(ctx, p.addr)
}
