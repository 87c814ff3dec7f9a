// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package scheduler_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/prober"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/scheduler"
)

// BenchmarkProbeRun is the cost of one TCP probe run on the agent's whole per-run path: the
// scheduler's dispatch, the run's context, the real prober (agent.ProberRunner), the thresholds
// and the metrics, with 1 000 targets every 100 ms (10 000 runs/s, the rate of
// BenchmarkCapacity/tcp/10000) against a loopback listener of this process that accepts with
// bare system calls, so that it allocates nothing itself. One op is one run: allocs/op and B/op
// (-benchmem) are what the agent allocates per probe; user-µs/run and sys-µs/run are the
// process's CPU time per run (the kernel part includes the listener's accept and both ends of
// the TCP work). ns/op is set by the schedule (about 100 µs), not by the cost.
//
//	cd images/agent && go test ./internal/scheduler/ -run '^$' -bench 'ProbeRun' -benchmem -benchtime 50000x
func BenchmarkProbeRun(b *testing.B) {
	const targets, period = 1000, 100 * time.Millisecond
	port := rawListener(b)

	var runs atomic.Int64
	pr := agent.ProberRunner(prober.New(prober.Options{}))
	var failed atomic.Value
	runner := scheduler.RunnerFunc(func(ctx context.Context, t scheduler.Target) scheduler.Outcome {
		out := pr.Run(ctx, t)
		if !out.Pass {
			failed.Store(out.Reason)
		}
		runs.Add(1)
		return out
	})
	s := scheduler.New(scheduler.Options{
		Workers: agent.DefaultProbeConcurrency, Runner: runner, Metrics: metrics.New(nil),
		MaxStartSpread: period,
	})
	probe := v1alpha1.Probe{Mode: v1alpha1.ProbeModeTCP, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3,
		TCP: &v1alpha1.TCPProbe{TargetPort: intstr.FromInt32(port)}}
	digest := scheduler.DigestProbe(probe)
	for r := range targets / 100 {
		res := types.NamespacedName{Namespace: fmt.Sprintf("ns-%d", r%3), Name: fmt.Sprintf("svc-%d", r)}
		ts := make([]scheduler.Target, 0, 100)
		for i := range 100 {
			uid := types.UID(fmt.Sprintf("pod-%d-%d", r, i))
			ts = append(ts, scheduler.Target{
				Key:   scheduler.NewKey(res, uid, 0, digest, "127.0.0.1", port, period),
				Probe: probe, Namespace: res.Namespace, PodName: string(uid), PodIP: "127.0.0.1", Port: port, Period: period,
			})
		}
		s.Set(res, ts)
	}
	ctx, cancel := context.WithCancel(b.Context())
	done := make(chan struct{})
	go func() {
		_ = s.Start(ctx)
		close(done)
	}()
	defer func() {
		cancel()
		<-done
	}()
	// Every target runs once before the window: its first-run allocations are not counted.
	waitRuns(b, &runs, 2*targets)

	b.ReportAllocs()
	b.ResetTimer()
	start := runs.Load()
	user0, sys0 := cpuTime(b)
	waitRuns(b, &runs, start+int64(b.N))
	user1, sys1 := cpuTime(b)
	b.StopTimer()
	n := float64(runs.Load() - start)
	b.ReportMetric((user1-user0).Seconds()/n*1e6, "user-µs/run")
	b.ReportMetric((sys1-sys0).Seconds()/n*1e6, "sys-µs/run")
	if reason, ok := failed.Load().(string); ok {
		b.Fatalf("a probe failed: %s", reason)
	}
}

// waitRuns waits until runs reaches n (a benchmark, not a test: polling a counter it cannot
// be told about).
func waitRuns(b *testing.B, runs *atomic.Int64, n int64) {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for runs.Load() < n {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d runs in a minute", runs.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// rawListener listens on 127.0.0.1 and accepts and closes connections with bare system calls
// on a thread of its own, allocating nothing per connection; it stops when the benchmark ends.
func rawListener(b *testing.B) int32 {
	b.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		b.Fatal(err)
	}
	if err := syscall.Listen(fd, 4096); err != nil {
		b.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		b.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			// accept4 with no address: nothing to allocate.
			nfd, _, errno := syscall.Syscall6(syscall.SYS_ACCEPT4, uintptr(fd), 0, 0, syscall.SOCK_CLOEXEC, 0, 0)
			switch errno {
			case 0:
				_ = syscall.Close(int(nfd))
			case syscall.EINTR, syscall.ECONNABORTED:
			default:
				return // shut down
			}
		}
	}()
	b.Cleanup(func() {
		_ = syscall.Shutdown(fd, syscall.SHUT_RDWR) // wakes the blocked accept
		<-stopped
		_ = syscall.Close(fd)
	})
	return int32(sa.(*syscall.SockaddrInet4).Port)
}
