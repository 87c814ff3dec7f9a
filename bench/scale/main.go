// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Command scale measures the controller program (images/controller/cmd/controller) at scale:
// many ServiceWithHealthchecks created at once against a real kube-apiserver whose Service
// range is a /16. Each round starts a fresh control plane and a fresh controller process, then
// reports the time until every child Service exists and every status is set, the controller's
// peak RSS and CPU time, and the API writes per resource. It prints a markdown section.
// See development/BENCHMARKS-HISTORY.md ("Controller scale").
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/loopback"
	"github.com/deckhouse/service-with-healthchecks/testkit/metrics"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

// options are the command line.
type options struct {
	controller     string
	resources      int
	rounds         int
	serviceCIDR    string
	creators       int
	timeout        time.Duration
	settle         time.Duration
	controllerArgs string
}

func main() {
	var o options
	flag.StringVar(&o.controller, "controller", "", "path of the built controller program (images/controller/cmd/controller); required")
	flag.IntVar(&o.resources, "resources", 1000, "ServiceWithHealthchecks created at once")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds, each with a fresh control plane and controller")
	flag.StringVar(&o.serviceCIDR, "service-cidr", "10.96.0.0/16", "kube-apiserver --service-cluster-ip-range (allocation only: no traffic is sent)")
	flag.IntVar(&o.creators, "creators", 32, "concurrent creators")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up on a round after this long")
	flag.DurationVar(&o.settle, "settle", 3*time.Second, "after the last status, wait until the controller's write counters stay flat this long")
	flag.StringVar(&o.controllerArgs, "controller-args", "", "extra controller arguments, space separated")
	flag.Parse()
	if o.controller == "" {
		fmt.Fprintln(os.Stderr, "scale: -controller is required")
		os.Exit(2)
	}
	var results []result
	for i := 1; i <= o.rounds; i++ {
		fmt.Fprintf(os.Stderr, "scale: round %d of %d\n", i, o.rounds)
		r, err := round(o)
		if err != nil {
			fmt.Fprintf(os.Stderr, "scale: round %d: %v\n", i, err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "scale: round %d: %+v\n", i, r)
		results = append(results, r)
	}
	report(os.Stdout, o, results)
}

// result is what one round measured.
type result struct {
	create       time.Duration // all creates returned
	services     time.Duration // every child Service seen by the watch
	statuses     time.Duration // every status set (observedGeneration and ServiceSynced=True)
	peakRSS      int64         // VmHWM of the controller, bytes
	cpu          time.Duration // controller user+system CPU over the round (start to settled)
	apiWrites    map[string]float64
	serviceW     map[string]float64
	statusW      float64
	reconciles   float64
	loadBefore   string
	loadAfter    string
	readyAfter   time.Duration // controller start to /readyz
	controllerUp time.Duration
}

func round(o options) (res result, err error) {
	res.loadBefore = process.LoadAvg()
	env, err := controlplane.Start(controlplane.Options{APIServerFlags: map[string]string{"service-cluster-ip-range": o.serviceCIDR}})
	if err != nil {
		return res, err
	}
	defer func() {
		if stopErr := env.Stop(); stopErr != nil && err == nil {
			err = stopErr
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()

	ns, err := env.CreateNamespace(ctx, "scale")
	if err != nil {
		return res, err
	}
	dir, err := os.MkdirTemp("", "swh-bench-scale-")
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
	args := []string{"--kubeconfig", kubeconfig, "--leader-elect=false",
		"--metrics-bind-address", metricsAddr, "--health-probe-bind-address", healthAddr, "--log-level", "error"}
	args = append(args, strings.Fields(o.controllerArgs)...)
	ctrl, err := process.Start("the controller", exec.Command(o.controller, args...), process.Options{LogFile: filepath.Join(dir, "controller.log")})
	if err != nil {
		return res, err
	}
	started := ctrl.Started()
	defer func() {
		_ = ctrl.Stop()
		if err != nil {
			fmt.Fprintf(os.Stderr, "controller output:\n%s\n", ctrl.Output(4000))
		}
	}()
	if err := ctrl.WaitHTTP(ctx, "http://"+healthAddr+"/readyz"); err != nil {
		return res, err
	}
	res.readyAfter = time.Since(started)

	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		return res, fmt.Errorf("clientset: %w", err)
	}
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		return res, fmt.Errorf("dynamic client: %w", err)
	}
	apiBefore, err := apiWrites(ctx, cs)
	if err != nil {
		return res, err
	}
	ctrlBefore, err := metrics.Get(ctx, metricsAddr)
	if err != nil {
		return res, err
	}
	cpuBefore, err := process.CPUTime(ctrl.PID())
	if err != nil {
		return res, err
	}

	// Informers (list, then watch, re-watching when a watch ends) run before the first create,
	// so nothing is missed; their handlers record when each object was first seen done.
	var (
		mu                         sync.Mutex
		servicesDone, statusesDone time.Time
		svcSeen                    = map[string]bool{}
		statusSet                  = map[string]bool{}
		done                       = make(chan struct{})
	)
	check := func() {
		if servicesDone.IsZero() && len(svcSeen) == o.resources {
			servicesDone = time.Now()
		}
		if statusesDone.IsZero() && len(statusSet) == o.resources {
			statusesDone = time.Now()
		}
		if !servicesDone.IsZero() && !statusesDone.IsZero() {
			select {
			case <-done:
			default:
				close(done)
			}
		}
	}
	onService := func(obj any) {
		if svc, ok := obj.(*corev1.Service); ok {
			mu.Lock()
			svcSeen[svc.Name] = true
			check()
			mu.Unlock()
		}
	}
	onResource := func(obj any) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return
		}
		var swh v1alpha1.ServiceWithHealthchecks
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &swh); err != nil || !statusIsSet(&swh) {
			return
		}
		mu.Lock()
		statusSet[swh.Name] = true
		check()
		mu.Unlock()
	}
	informerCtx, stopInformers := context.WithCancel(ctx)
	defer stopInformers()
	svcFactory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	if _, err := svcFactory.Core().V1().Services().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onService, UpdateFunc: func(_, obj any) { onService(obj) },
	}); err != nil {
		return res, fmt.Errorf("service informer: %w", err)
	}
	swhFactory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, ns, nil)
	gvr := v1alpha1.GroupVersion.WithResource("servicewithhealthchecks")
	if _, err := swhFactory.ForResource(gvr).Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onResource, UpdateFunc: func(_, obj any) { onResource(obj) },
	}); err != nil {
		return res, fmt.Errorf("resource informer: %w", err)
	}
	svcFactory.Start(informerCtx.Done())
	swhFactory.Start(informerCtx.Done())
	for typ, ok := range svcFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return res, fmt.Errorf("informer for %v did not sync", typ)
		}
	}
	for typ, ok := range swhFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return res, fmt.Errorf("informer for %v did not sync", typ)
		}
	}

	t0 := time.Now()
	if err := createAll(ctx, env.Client, ns, o.resources, o.creators); err != nil {
		return res, err
	}
	res.create = time.Since(t0)
	select {
	case <-done:
	case <-ctrl.Done():
		return res, ctrl.Err()
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		return res, fmt.Errorf("after %s: %d Services, %d statuses of %d", o.timeout, len(svcSeen), len(statusSet), o.resources)
	}
	res.services, res.statuses = servicesDone.Sub(t0), statusesDone.Sub(t0)

	// Let the controller finish what it still does (events, late status rewrites) before counting.
	ctrlAfter, err := settle(ctx, metricsAddr, o.settle)
	if err != nil {
		return res, err
	}
	apiAfter, err := apiWrites(ctx, cs)
	if err != nil {
		return res, err
	}
	cpuAfter, err := process.CPUTime(ctrl.PID())
	if err != nil {
		return res, err
	}
	res.cpu = cpuAfter - cpuBefore
	if res.peakRSS, err = process.PeakRSS(ctrl.PID()); err != nil {
		return res, err
	}
	res.apiWrites = map[string]float64{}
	for k, v := range apiAfter {
		if d := v - apiBefore[k]; d > 0 {
			res.apiWrites[k] = d
		}
	}
	// The benchmark's own creates are not the controller's.
	res.apiWrites["POST servicewithhealthchecks"] -= float64(o.resources)
	if res.apiWrites["POST servicewithhealthchecks"] <= 0 {
		delete(res.apiWrites, "POST servicewithhealthchecks")
	}
	res.serviceW = map[string]float64{}
	for _, w := range ctrlAfter.Samples("swh_controller_service_writes_total") {
		op := w.Labels["operation"]
		res.serviceW[op] = w.Value - ctrlBefore.Sum("swh_controller_service_writes_total", map[string]string{"operation": op})
	}
	res.statusW = ctrlAfter.Sum("swh_controller_status_writes_total", nil) - ctrlBefore.Sum("swh_controller_status_writes_total", nil)
	res.reconciles = ctrlAfter.Sum("swh_controller_reconciles_total", nil) - ctrlBefore.Sum("swh_controller_reconciles_total", nil)
	res.controllerUp = time.Since(started)
	res.loadAfter = process.LoadAvg()
	return res, nil
}

// statusIsSet is the benchmark's "status set": the controller has written a status for the
// current generation and the child Service is in line (ServiceSynced=True).
func statusIsSet(swh *v1alpha1.ServiceWithHealthchecks) bool {
	if swh.Status.ObservedGeneration != swh.Generation {
		return false
	}
	for _, c := range swh.Status.Conditions {
		if c.Type == v1alpha1.ConditionServiceSynced {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

func createAll(ctx context.Context, c client.Client, ns string, n, workers int) error {
	names := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range names {
				name := fmt.Sprintf("svc-%04d", i)
				swh := &v1alpha1.ServiceWithHealthchecks{
					ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
					Spec: v1alpha1.ServiceWithHealthchecksSpec{
						Selector: map[string]string{"app": name},
						Ports: []v1alpha1.ServicePort{
							{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
						},
						Healthcheck: &v1alpha1.Healthcheck{PeriodSeconds: 1, Probes: []v1alpha1.Probe{{
							Mode: v1alpha1.ProbeModeTCP, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3,
							TCP: &v1alpha1.TCPProbe{TargetPort: intstr.FromInt32(8080)},
						}}},
					},
				}
				if err := c.Create(ctx, swh); err != nil {
					errs <- fmt.Errorf("creating %s: %w", name, err)
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := range n {
		select {
		case names <- i:
		case err = <-errs:
			break feed
		}
	}
	close(names)
	wg.Wait()
	if err != nil {
		return err
	}
	select {
	case err = <-errs:
		return err
	default:
		return nil
	}
}

// settle waits until the controller's write and reconcile counters stay flat for quiet and
// returns its metrics then.
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
			return nil, ctx.Err()
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

// apiWrites reads the API server's apiserver_request_total and sums the requests other than
// watches and lists by "VERB resource[/subresource]", with " (code)" for answers other than 2xx.
func apiWrites(ctx context.Context, cs kubernetes.Interface) (map[string]float64, error) {
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
		if l["verb"] == "WATCH" || l["verb"] == "LIST" && l["resource"] != "pods" {
			continue // the benchmark's informers, and the controller's start-up lists
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
