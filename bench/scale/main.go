// Command scale measures the controller program (images/controller/cmd/controller) at scale:
// many ServiceWithHealthchecks created at once against a real kube-apiserver whose Service
// range is a /16. Each round starts a fresh control plane and a fresh controller process, then
// reports the time until every child Service exists and every status is set, the controller's
// peak RSS and CPU time, and the API writes per resource. It prints a markdown section.
// See development/BENCHMARKS.md ("Controller scale").
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
	res.loadBefore = loadavg()
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
	metricsAddr, err := freeAddr()
	if err != nil {
		return res, err
	}
	healthAddr, err := freeAddr()
	if err != nil {
		return res, err
	}
	args := []string{"--kubeconfig", kubeconfig, "--leader-elect=false",
		"--metrics-bind-address", metricsAddr, "--health-probe-bind-address", healthAddr, "--log-level", "error"}
	args = append(args, strings.Fields(o.controllerArgs)...)
	cmd := exec.Command(o.controller, args...)
	logFile, err := os.Create(filepath.Join(dir, "controller.log"))
	if err != nil {
		return res, fmt.Errorf("controller log: %w", err)
	}
	defer func() { _ = logFile.Close() }()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	started := time.Now()
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("starting the controller: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if err != nil {
			if b, readErr := os.ReadFile(logFile.Name()); readErr == nil {
				fmt.Fprintf(os.Stderr, "controller output:\n%s\n", tail(string(b), 4000))
			}
		}
	}()
	if err := waitReady(ctx, "http://"+healthAddr+"/readyz", exited); err != nil {
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
	ctrlBefore, err := scrape(ctx, "http://"+metricsAddr+"/metrics")
	if err != nil {
		return res, err
	}
	cpuBefore, err := cpuTime(cmd.Process.Pid)
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
	case <-exited:
		return res, errors.New("the controller exited")
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		return res, fmt.Errorf("after %s: %d Services, %d statuses of %d", o.timeout, len(svcSeen), len(statusSet), o.resources)
	}
	res.services, res.statuses = servicesDone.Sub(t0), statusesDone.Sub(t0)

	// Let the controller finish what it still does (events, late status rewrites) before counting.
	ctrlAfter, err := settle(ctx, "http://"+metricsAddr+"/metrics", o.settle)
	if err != nil {
		return res, err
	}
	apiAfter, err := apiWrites(ctx, cs)
	if err != nil {
		return res, err
	}
	cpuAfter, err := cpuTime(cmd.Process.Pid)
	if err != nil {
		return res, err
	}
	res.cpu = cpuAfter - cpuBefore
	if res.peakRSS, err = peakRSS(cmd.Process.Pid); err != nil {
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
	for k, v := range ctrlAfter {
		if op, ok := strings.CutPrefix(k, `swh_controller_service_writes_total{operation="`); ok {
			res.serviceW[strings.TrimSuffix(op, `"}`)] = v - ctrlBefore[k]
		}
	}
	res.statusW = ctrlAfter["swh_controller_status_writes_total"] - ctrlBefore["swh_controller_status_writes_total"]
	for k, v := range ctrlAfter {
		if strings.HasPrefix(k, "swh_controller_reconciles_total{") {
			res.reconciles += v - ctrlBefore[k]
		}
	}
	res.controllerUp = time.Since(started)
	res.loadAfter = loadavg()
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
func settle(ctx context.Context, url string, quiet time.Duration) (map[string]float64, error) {
	key := func(m map[string]float64) string {
		var parts []string
		for k, v := range m {
			if strings.HasPrefix(k, "swh_controller_") && !strings.Contains(k, "duration") {
				parts = append(parts, fmt.Sprintf("%s=%g", k, v))
			}
		}
		sort.Strings(parts)
		return strings.Join(parts, ",")
	}
	last, err := scrape(ctx, url)
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
		m, err := scrape(ctx, url)
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

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([^ ]+)`)

// scrape reads a Prometheus text endpoint into "name{labels}" → value.
func scrape(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	return parseMetrics(resp.Body)
}

func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := sampleLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			continue
		}
		out[m[1]+m[2]] += v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading metrics: %w", err)
	}
	return out, nil
}

var labelPair = regexp.MustCompile(`(\w+)="([^"]*)"`)

// apiWrites reads the API server's apiserver_request_total and sums the requests other than
// watches and lists by "VERB resource[/subresource]", with " (code)" for answers other than 2xx.
func apiWrites(ctx context.Context, cs kubernetes.Interface) (map[string]float64, error) {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	all, err := parseMetrics(strings.NewReader(string(raw)))
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for k, v := range all {
		labels, ok := strings.CutPrefix(k, "apiserver_request_total{")
		if !ok {
			continue
		}
		l := map[string]string{}
		for _, p := range labelPair.FindAllStringSubmatch(labels, -1) {
			l[p[1]] = p[2]
		}
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
		out[key] += v
	}
	return out, nil
}

func waitReady(ctx context.Context, url string, exited <-chan struct{}) error {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("the controller exited before it was ready")
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", url, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String(), nil
}

// peakRSS is VmHWM of a process, in bytes.
func peakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("reading the controller's status: %w", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing VmHWM %q: %w", v, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, errors.New("no VmHWM in /proc/<pid>/status")
}

// cpuTime is the user+system CPU time of a process (utime and stime of /proc/<pid>/stat, in
// clock ticks of 1/100 s on Linux).
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("reading the controller's stat: %w", err)
	}
	s := string(b)
	// Fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("parsing /proc/%d/stat: %w", pid, err)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
