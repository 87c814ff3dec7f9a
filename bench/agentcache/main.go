// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Command agentcache measures what other nodes cost one agent (issue 19 part 1): the agent
// program (images/agent/cmd/agent) for one node, against a real kube-apiserver holding 0, 10,000
// and 50,000 EndpointSlices of other nodes — written the way those nodes' agents write them —
// that keep changing at a steady rate. It reports the agent's resident memory and its CPU time
// over a fixed window for each count, and, given a second build (-baseline), the same for it,
// alternating the two builds round by round. It prints a markdown section
// (development/BENCHMARKS-HISTORY.md, "Agent cost of other nodes").
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/loopback"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

type options struct {
	agent, baseline string
	counts          []int
	rounds          int
	window, settle  time.Duration
	churn           int
	writers         int
}

func main() {
	var o options
	var counts string
	flag.StringVar(&o.agent, "agent", "", "the agent program to measure (required)")
	flag.StringVar(&o.baseline, "baseline", "", "a second agent program to compare with (optional)")
	flag.StringVar(&counts, "counts", "0,10000,50000", "numbers of other nodes' slices")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds per count and build")
	flag.DurationVar(&o.window, "window", 60*time.Second, "CPU is measured over this window")
	flag.DurationVar(&o.settle, "settle", 15*time.Second, "after the agent is ready, wait this long before the window")
	flag.IntVar(&o.churn, "churn", 50, "updates per second of other nodes' slices during the window")
	flag.IntVar(&o.writers, "writers", 16, "concurrent writers that create the slices")
	flag.Parse()
	if o.agent == "" {
		fmt.Fprintln(os.Stderr, "agentcache: -agent is required")
		os.Exit(2)
	}
	for _, f := range strings.Split(counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			fmt.Fprintf(os.Stderr, "agentcache: -counts: %q is not a count\n", f)
			os.Exit(2)
		}
		o.counts = append(o.counts, n)
	}
	builds := []string{"agent"}
	bins := map[string]string{"agent": o.agent}
	if o.baseline != "" {
		builds = append(builds, "baseline")
		bins["baseline"] = o.baseline
	}
	results := map[key][]sample{}
	for _, n := range o.counts {
		for r := 1; r <= o.rounds; r++ {
			// Alternate which build goes first, so a drift of the machine hits both alike.
			order := slices.Clone(builds)
			if r%2 == 0 {
				slices.Reverse(order)
			}
			for _, b := range order {
				fmt.Fprintf(os.Stderr, "agentcache: %d other slices, round %d, %s (load %s)\n", n, r, b, process.LoadAvg())
				s, err := round(o, bins[b], n)
				if err != nil {
					fmt.Fprintf(os.Stderr, "agentcache: %v\n", err)
					os.Exit(1)
				}
				fmt.Fprintf(os.Stderr, "agentcache:   %+v\n", s)
				results[key{b, n}] = append(results[key{b, n}], s)
			}
		}
	}
	report(o, builds, results)
}

type key struct {
	build string
	count int
}

// sample is what one round measured.
type sample struct {
	rss, peak  int64
	cpu        time.Duration
	ready      time.Duration
	load       string
	churnMade  int
	slicesMade int
}

const node = "bench-node"

func round(o options, bin string, n int) (s sample, err error) {
	env, err := controlplane.Start(controlplane.Options{})
	if err != nil {
		return s, err
	}
	defer func() { err = errors.Join(err, env.Stop()) }()
	ctx := context.Background()
	c := env.Client
	if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		return s, fmt.Errorf("creating the agent's Node: %w", err)
	}
	// The agent renews its node Lease there.
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: wellknown.Namespace}}); err != nil {
		return s, fmt.Errorf("creating the module namespace: %w", err)
	}
	ns, err := env.CreateNamespace(ctx, "agentcache")
	if err != nil {
		return s, err
	}
	if s.slicesMade, err = createOthers(ctx, c, ns, n, o.writers); err != nil {
		return s, err
	}

	dir, err := os.MkdirTemp("", "swh-bench-agentcache-")
	if err != nil {
		return s, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	kubeconfig, err := env.WriteKubeConfig(dir)
	if err != nil {
		return s, err
	}
	addrs, err := loopback.FreeAddrs(2)
	if err != nil {
		return s, err
	}
	cmd := exec.Command(bin, "--kubeconfig", kubeconfig, "--node-name", node, "--metrics-bind-address", addrs[0], //nolint:gosec // our own build
		"--health-probe-bind-address", addrs[1], "--log-level", "error")
	cmd.Env = append(os.Environ(), "KUBECONFIG=")
	p, err := process.Start("the agent", cmd, process.Options{LogFile: filepath.Join(dir, "agent.log")})
	if err != nil {
		return s, err
	}
	defer func() { err = errors.Join(err, p.Stop()) }()
	readyCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := p.WaitHTTP(readyCtx, "http://"+addrs[1]+"/readyz"); err != nil {
		return s, fmt.Errorf("waiting for the agent to be ready: %w (%s)", err, p.Output(4096))
	}
	s.ready = time.Since(p.Started())
	time.Sleep(o.settle) // a benchmark's measuring pause, not a synchronisation

	s.load = process.LoadAvg()
	before, err := process.CPUTime(p.PID())
	if err != nil {
		return s, err
	}
	churnCtx, stopChurn := context.WithTimeout(ctx, o.window)
	s.churnMade = churn(churnCtx, c, ns, n, o.churn)
	stopChurn()
	after, err := process.CPUTime(p.PID())
	if err != nil {
		return s, err
	}
	s.cpu = after - before
	if s.rss, err = process.RSS(p.PID()); err != nil {
		return s, err
	}
	if s.peak, err = process.PeakRSS(p.PID()); err != nil {
		return s, err
	}
	return s, nil
}

// otherNode is the node of the i-th other slice: 100 slices a node, the way 50 two-port
// resources on each of many nodes would make them.
func otherNode(i int) string { return fmt.Sprintf("node-%05d", i/100) }

// otherSlice is the i-th slice of another node, as that node's agent writes it.
func otherSlice(ns string, i int) *discoveryv1.EndpointSlice {
	n := otherNode(i)
	key := slicemeta.SliceKey{Resource: fmt.Sprintf("res-%02d", i%50), Port: []string{"web", "smtp"}[i%100/50], Node: n}
	ip := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: key.Name(), Labels: key.Labels(), Annotations: key.Annotations(),
			OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference(key.Resource, "00000000-0000-0000-0000-000000000000")},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(n),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: "pod-" + strconv.Itoa(i)},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To(key.Port), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
}

// createOthers creates n slices of other nodes with the given number of concurrent writers.
func createOthers(ctx context.Context, c client.Client, ns string, n, writers int) (int, error) {
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := w; i < n; i += writers {
				if err := c.Create(ctx, otherSlice(ns, i)); err != nil {
					errs <- fmt.Errorf("creating slice %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	if n > 0 {
		fmt.Fprintf(os.Stderr, "agentcache:   created %d slices of other nodes in %s\n", n, time.Since(start).Round(time.Second))
	}
	return n, nil
}

// churn flips an endpoint of a random other slice rate times a second until ctx ends, as the
// other nodes' agents would; it returns how many updates it made.
func churn(ctx context.Context, c client.Client, ns string, n, rate int) int {
	if n == 0 || rate <= 0 {
		<-ctx.Done()
		return 0
	}
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	made := 0
	for {
		select {
		case <-ctx.Done():
			return made
		case <-tick.C:
		}
		want := otherSlice(ns, rand.IntN(n))
		cur := &discoveryv1.EndpointSlice{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(want), cur); err != nil {
			continue
		}
		ready := !*cur.Endpoints[0].Conditions.Ready
		cur.Endpoints[0].Conditions.Ready, cur.Endpoints[0].Conditions.Serving = &ready, &ready
		if err := c.Update(ctx, cur); err == nil {
			made++
		}
	}
}

func median[T int64 | time.Duration](xs []T) T {
	s := slices.Clone(xs)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func report(o options, builds []string, results map[key][]sample) {
	fmt.Println("## Agent cost of other nodes")
	fmt.Println()
	fmt.Printf("One agent program, node %q with no pods of its own, against a fresh kube-apiserver holding N EndpointSlices of other nodes\n", node)
	fmt.Printf("(100 per node, one endpoint each, written as their agents write them); during a %s window %d of them change per second.\n", o.window, o.churn)
	fmt.Printf("RSS after the window and CPU time over it; medians of %d rounds, builds alternating.\n", o.rounds)
	fmt.Println()
	fmt.Println("| build | other slices | RSS (MiB) | peak RSS (MiB) | CPU over the window (s) | ready after (s) | updates in the window | load at the window |")
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, b := range builds {
		for _, n := range o.counts {
			ss := results[key{b, n}]
			var rss, peak []int64
			var cpu, ready []time.Duration
			var loads []string
			churned := 0
			for _, s := range ss {
				rss, peak, cpu, ready = append(rss, s.rss), append(peak, s.peak), append(cpu, s.cpu), append(ready, s.ready)
				loads = append(loads, s.load)
				churned += s.churnMade
			}
			fmt.Printf("| %s | %d | %.1f | %.1f | %.2f | %.1f | %d | %s |\n", b, n, float64(median(rss))/(1<<20), float64(median(peak))/(1<<20),
				median(cpu).Seconds(), median(ready).Seconds(), churned/len(ss), strings.Join(loads, "; "))
		}
	}
}
