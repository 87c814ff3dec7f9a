// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package capacity

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The helpers below match images/agent/internal/scheduler/capacity_bench_test.go: the three
// probers of bench/capacity/run.sh report the same metrics, measured the same way.

// reportInput is what one capacity case measured over its window.
type reportInput struct {
	wall      time.Duration
	user, sys time.Duration // CPU time of the process in the window (getrusage)
	runs      int64
	failures  int64
	lags      []float64 // seconds
}

// report reports a case's metrics. CPU is split into user and system (kernel) time: the kernel's
// share is syscalls and, on loopback, the TCP work of both ends, which no prober can save; the
// user part is what our code costs on top. getrusage's split is the kernel's tick-sampled ratio
// applied to the exact total, so it is exact over a window of thousands of ticks, not per probe.
func report(b *testing.B, in reportInput) {
	b.Helper()
	wall := in.wall.Seconds()
	cpu := in.user + in.sys
	if cpu > 0 {
		b.ReportMetric(float64(in.sys)/float64(cpu)*100, "sys-%")
	}
	b.ReportMetric(cpu.Seconds()/wall, "cpu-cores")
	b.ReportMetric(float64(peakRSS(b))/(1<<20), "peak-RSS-MiB")
	b.ReportMetric(percentile(in.lags, 0.50)*1000, "lag-p50-ms")
	b.ReportMetric(percentile(in.lags, 0.99)*1000, "lag-p99-ms")
	b.ReportMetric(float64(in.runs)/wall, "probes/s")
	b.ReportMetric(float64(in.failures)/wall, "failures/s")
	if in.runs > 0 {
		perProbe := func(d time.Duration) float64 { return d.Seconds() / float64(in.runs) * 1e6 }
		b.ReportMetric(perProbe(cpu), "cpu-µs/probe")
		b.ReportMetric(perProbe(in.user), "user-µs/probe")
		b.ReportMetric(perProbe(in.sys), "sys-µs/probe")
	}
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

// peakRSS is the process's peak resident set size (VmHWM) in bytes.
func peakRSS(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmHWM in /proc/self/status")
	return 0
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

// startServer runs ./server in a process of its own and returns its listener addresses by
// protocol; it stops when the benchmark ends.
func startServer(b *testing.B) map[string][]string {
	bin := os.Getenv("SWH_CAPACITY_SERVER")
	if bin == "" {
		bin = filepath.Join(b.TempDir(), "server")
		if out, err := exec.Command("go", "build", "-o", bin, "./server").CombinedOutput(); err != nil {
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
