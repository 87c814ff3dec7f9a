// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package scheduler_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/prober"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/scheduler"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

// BenchmarkCapacity measures how many probe targets one agent carries: the agent's scheduler
// (agent.DefaultProbeConcurrency workers) with the real prober, n targets with a 1 s period,
// against TCP and HTTP listeners of the bench/capacity server, which runs in its own process so
// that the CPU time and peak RSS reported here are the prober's alone. Run each case in a
// process of its own (peak RSS is the process's high-water mark); bench/capacity/run.sh does,
// and runs the kubelet's probe code and the floor (bare system calls, BenchmarkFloorCapacity)
// the same way for the ratios. Results: development/BENCHMARKS.md.
//
//	cd images/agent && go test ./internal/scheduler/ -run '^$' -bench 'Capacity/tcp/10000$' -benchtime 1x
//
// Environment: SWH_CAPACITY_SERVER (the server binary; built from bench/capacity when unset),
// SWH_CAPACITY_WARMUP (5s), SWH_CAPACITY_DURATION (20s).
func BenchmarkCapacity(b *testing.B) {
	addrs := startCapacityServer(b)
	for _, mode := range []string{"tcp", "http"} {
		for _, n := range []int{1000, 5000, 10000} {
			b.Run(fmt.Sprintf("%s/%d", mode, n), func(b *testing.B) {
				runCapacity(b, mode, n, addrs[mode])
			})
		}
	}
}

func runCapacity(b *testing.B, mode string, n int, addrs []string) {
	warmup := envDuration(b, "SWH_CAPACITY_WARMUP", 5*time.Second)
	measure := envDuration(b, "SWH_CAPACITY_DURATION", 20*time.Second)
	const period = time.Second

	m := metrics.New(nil)
	lag := &lagRecorder{Histogram: m.SchedulingLag}
	m.SchedulingLag = lag
	var runs, failures atomic.Int64
	pr := agent.ProberRunner(prober.New(prober.Options{}))
	runner := scheduler.RunnerFunc(func(ctx context.Context, t scheduler.Target) scheduler.Outcome {
		out := pr.Run(ctx, t)
		runs.Add(1)
		if !out.Pass {
			failures.Add(1)
		}
		return out
	})
	s := scheduler.New(scheduler.Options{Workers: agent.DefaultProbeConcurrency, Runner: runner, Metrics: m})

	// 100 targets per resource, like 100 pods of one Service on the node.
	byRes := map[types.NamespacedName][]scheduler.Target{}
	for i := range n {
		host, portStr, err := net.SplitHostPort(addrs[i%len(addrs)])
		if err != nil {
			b.Fatal(err)
		}
		port, _ := strconv.Atoi(portStr)
		probe := v1alpha1.Probe{TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3}
		if mode == "tcp" {
			probe.Mode, probe.TCP = v1alpha1.ProbeModeTCP, &v1alpha1.TCPProbe{TargetPort: intstr.FromInt32(int32(port))}
		} else {
			probe.Mode, probe.HTTP = v1alpha1.ProbeModeHTTP, &v1alpha1.HTTPProbe{TargetPort: intstr.FromInt32(int32(port)), Path: "/healthz"}
		}
		res := types.NamespacedName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i/100)}
		uid := types.UID(fmt.Sprintf("pod-%d", i))
		byRes[res] = append(byRes[res], scheduler.Target{
			Key:   scheduler.NewKey(res, uid, 0, scheduler.DigestProbe(probe), host, int32(port), period),
			Probe: probe, Namespace: "bench", PodName: string(uid), PodIP: host, Port: int32(port), Period: period,
		})
	}
	for res, ts := range byRes {
		s.Set(res, ts)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_ = s.Start(ctx)
		close(done)
	}()
	defer func() {
		cancel()
		<-done
	}()

	time.Sleep(warmup) // a benchmark, not a test: the load runs for a fixed time
	b.ResetTimer()
	lag.start()
	runs.Store(0)
	failures.Store(0)
	user0, sys0 := cpuTime(b)
	wall0 := time.Now()
	time.Sleep(measure)
	user1, sys1 := cpuTime(b)
	wall1 := time.Now()
	lags := lag.stop()
	b.StopTimer()
	r, f := runs.Load(), failures.Load()

	wall := wall1.Sub(wall0).Seconds()
	user, sys := user1-user0, sys1-sys0
	cpu := user + sys
	if cpu > 0 {
		// The kernel's share: syscalls and, on loopback, the TCP work of both ends.
		b.ReportMetric(float64(sys)/float64(cpu)*100, "sys-%")
	}
	b.ReportMetric(cpu.Seconds()/wall, "cpu-cores")
	b.ReportMetric(float64(selfPeakRSS(b))/(1<<20), "peak-RSS-MiB")
	b.ReportMetric(percentile(lags, 0.50)*1000, "lag-p50-ms")
	b.ReportMetric(percentile(lags, 0.99)*1000, "lag-p99-ms")
	b.ReportMetric(float64(r)/wall, "probes/s")
	b.ReportMetric(float64(f)/wall, "failures/s")
	if r > 0 {
		// User and system time per probe: getrusage's split is the kernel's tick-sampled ratio
		// applied to the exact total, exact over a window of thousands of ticks.
		perProbe := func(d time.Duration) float64 { return d.Seconds() / float64(r) * 1e6 }
		b.ReportMetric(perProbe(cpu), "cpu-µs/probe")
		b.ReportMetric(perProbe(user), "user-µs/probe")
		b.ReportMetric(perProbe(sys), "sys-µs/probe")
	}
}

// lagRecorder keeps every scheduling lag the scheduler observes while recording, for exact
// percentiles (the metric's buckets are too coarse for a p99 under 100 ms).
type lagRecorder struct {
	prometheus.Histogram

	mu        sync.Mutex
	recording bool
	lags      []float64
}

func (l *lagRecorder) Observe(v float64) {
	l.Histogram.Observe(v)
	l.mu.Lock()
	if l.recording {
		l.lags = append(l.lags, v)
	}
	l.mu.Unlock()
}

func (l *lagRecorder) start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recording, l.lags = true, make([]float64, 0, 1<<18)
}

func (l *lagRecorder) stop() []float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recording = false
	return l.lags
}

func percentile(vs []float64, p float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	slices.Sort(vs)
	return vs[min(int(float64(len(vs))*p), len(vs)-1)]
}

// cpuTime is the user and system CPU time of this process so far.
func cpuTime(b *testing.B) (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

func envDuration(b *testing.B, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		b.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

// startCapacityServer runs the bench/capacity server in a process of its own and returns its
// listener addresses by protocol; it stops when the benchmark ends.
func startCapacityServer(b *testing.B) map[string][]string {
	bin := os.Getenv("SWH_CAPACITY_SERVER")
	if bin == "" {
		bin = filepath.Join(b.TempDir(), "server")
		build := exec.Command("go", "build", "-o", bin, "./server")
		build.Dir = filepath.Join("..", "..", "..", "..", "bench", "capacity")
		build.Env = append(os.Environ(), "GOWORK=off")
		if out, err := build.CombinedOutput(); err != nil {
			b.Fatalf("building the capacity server: %v\n%s", err, out)
		}
	}
	cmd := exec.Command(bin)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatalf("starting the capacity server: %v", err)
	}
	b.Cleanup(func() {
		_ = stdin.Close() // the server exits when its stdin closes
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	if err != nil {
		b.Fatalf("reading the capacity server's addresses: %v", err)
	}
	addrs := map[string][]string{}
	if err := json.Unmarshal(line, &addrs); err != nil {
		b.Fatalf("parsing the capacity server's addresses %q: %v", line, err)
	}
	return addrs
}

// selfPeakRSS is this process's peak resident set size (VmHWM) in bytes.
func selfPeakRSS(b *testing.B) int64 {
	n, err := process.PeakRSS(os.Getpid())
	if err != nil {
		b.Fatal(err)
	}
	return n
}
