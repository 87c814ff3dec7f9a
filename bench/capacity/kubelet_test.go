// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package capacity

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/kubernetes/pkg/probe"
	httpprobe "k8s.io/kubernetes/pkg/probe/http"
	tcpprobe "k8s.io/kubernetes/pkg/probe/tcp"
)

// BenchmarkKubeletCapacity drives n probe targets with a 1 s period the way the kubelet does
// (pkg/kubelet/prober/worker.go: one goroutine per probe that sleeps a random part of the
// period, then probes on every tick of a time.Ticker), with the kubelet's own probe code. Only
// the probe path is here: no results cache, no status manager, no pod workers, so this is a
// lower bound of the kubelet's cost. Lag is how late a probe starts against its tick.
//
//	cd bench/capacity && GOWORK=off go test -run '^$' -bench 'KubeletCapacity/tcp/10000$' -benchtime 1x
//
// Environment as for the agent's BenchmarkCapacity: SWH_CAPACITY_SERVER, SWH_CAPACITY_WARMUP
// (5s), SWH_CAPACITY_DURATION (20s).
func BenchmarkKubeletCapacity(b *testing.B) {
	addrs := startServer(b)
	for _, mode := range []string{"tcp", "http"} {
		for _, n := range []int{1000, 5000, 10000} {
			b.Run(fmt.Sprintf("%s/%d", mode, n), func(b *testing.B) {
				runKubelet(b, mode, n, addrs[mode])
			})
		}
	}
}

func runKubelet(b *testing.B, mode string, n int, addrs []string) {
	warmup := envDuration(b, "SWH_CAPACITY_WARMUP", 5*time.Second)
	measure := envDuration(b, "SWH_CAPACITY_DURATION", 20*time.Second)
	const period = time.Second
	const timeout = time.Second

	reasons := &failureReasons{counts: map[string]int{}}
	defer reasons.print(b)
	tcp := tcpprobe.New()
	httpProber := httpprobe.New(false)
	var recording atomic.Bool
	var mu sync.Mutex
	var lags []float64
	var runs, failures atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		host, portStr, err := net.SplitHostPort(addrs[i%len(addrs)])
		if err != nil {
			b.Fatal(err)
		}
		port, _ := strconv.Atoi(portStr)
		action := &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt(port), Scheme: corev1.URISchemeHTTP}
		container := &corev1.Container{}
		run := func() bool {
			var res probe.Result
			var out string
			var err error
			if mode == "tcp" {
				res, out, err = tcp.Probe(host, port, timeout)
			} else {
				// The kubelet builds the request for every run (pkg/kubelet/prober.runProbe).
				req, rerr := httpprobe.NewRequestForHTTPGetAction(action, container, host, "probe")
				if rerr != nil {
					reasons.note(rerr.Error())
					return false
				}
				res, out, err = httpProber.Probe(req, timeout)
			}
			if err != nil || res != probe.Success {
				reasons.note(fmt.Sprint(out, " ", err))
				return false
			}
			return true
		}
		wg.Go(func() {
			select {
			case <-time.After(time.Duration(rand.Int64N(int64(period)))):
			case <-stop:
				return
			}
			ticker := time.NewTicker(period)
			defer ticker.Stop()
			start := time.Now()
			for {
				if recording.Load() {
					since := time.Since(start)
					lag := since - since.Truncate(period)
					mu.Lock()
					lags = append(lags, lag.Seconds())
					mu.Unlock()
				}
				ok := run()
				runs.Add(1)
				if !ok {
					failures.Add(1)
				}
				select {
				case <-ticker.C:
				case <-stop:
					return
				}
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()

	time.Sleep(warmup) // a benchmark, not a test: the load runs for a fixed time
	b.ResetTimer()
	mu.Lock()
	lags = make([]float64, 0, 1<<18)
	mu.Unlock()
	runs.Store(0)
	failures.Store(0)
	recording.Store(true)
	user0, sys0 := cpuTime(b)
	wall0 := time.Now()
	time.Sleep(measure)
	user1, sys1 := cpuTime(b)
	wall1 := time.Now()
	recording.Store(false)
	b.StopTimer()
	mu.Lock()
	got := lags
	mu.Unlock()
	r, f := runs.Load(), failures.Load()

	report(b, reportInput{wall: wall1.Sub(wall0), user: user1 - user0, sys: sys1 - sys0, runs: r, failures: f, lags: got})
}

// failureReasons counts why probes failed (addresses and ports left out), for stderr.
type failureReasons struct {
	mu     sync.Mutex
	counts map[string]int
}

var digits = regexp.MustCompile(`[0-9.:]+`)

func (f *failureReasons) note(reason string) {
	f.mu.Lock()
	f.counts[digits.ReplaceAllString(reason, "#")]++
	f.mu.Unlock()
}

func (f *failureReasons) print(b *testing.B) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for r, n := range f.counts {
		fmt.Fprintf(os.Stderr, "%s: %d failures: %s\n", b.Name(), n, r)
	}
}
