// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Command publish measures publish latency: from a decisive probe result to the EndpointSlice
// change a watcher sees, for the agent program (images/agent/cmd/agent) and, side by side on
// the same API server, for kube-controller-manager's EndpointSlice controller reacting to a
// pod's Ready condition. It runs as root inside the isolated namespaces of testkit/cluster and
// prints a markdown section. See development/BENCHMARKS-HISTORY.md ("Publish latency").
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

// options are the command line.
type options struct {
	agent       string
	sizes       []int
	samples     int
	rounds      int
	agentArgs   string
	kcmArgs     string
	individual  bool
	waitTimeout time.Duration
	samplesOut  string
	json        bool
	// builtinWrite is how the built-in side writes a pod's status: builtinWriteKubelet or
	// builtinWriteUpdate.
	builtinWrite string
	// apiServerGC adds the API server's garbage collection to the report (apiserver.go).
	apiServerGC bool
	// policies is a file of the chart's ValidatingAdmissionPolicies and bindings to install, with
	// the agent acting as its service account on its node (policies.go); empty: none.
	policies string
	// dataplane also measures until the dataplane's rules route the change (rules.go):
	// dataplaneKubeProxy, dataplaneCilium (cilium.go), or "" for the watch event only.
	dataplane string
}

func main() {
	cluster.Isolate() // returns only inside the isolated namespaces (or at once without root)
	var o options
	var sizes string
	flag.StringVar(&o.agent, "agent", "", "path of the built agent program (images/agent/cmd/agent); required")
	flag.StringVar(&sizes, "sizes", "100,1000", "endpoints on the node, comma separated")
	flag.IntVar(&o.samples, "samples", 100, "flips measured per path, size and round")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds of samples per size")
	flag.StringVar(&o.agentArgs, "agent-args", "", "extra agent arguments, space separated")
	flag.StringVar(&o.kcmArgs, "kcm-args", "", "extra kube-controller-manager arguments, space separated")
	flag.BoolVar(&o.individual, "individual-pods", false, "one network namespace per pod (cluster.AddPod) instead of cluster.NewBulkPods")
	flag.DurationVar(&o.waitTimeout, "wait", 15*time.Second, "give up on one sample after this long")
	flag.BoolVar(&o.json, "json", false, "the benchmark's own client (status updates, watcher) talks JSON instead of protobuf")
	flag.StringVar(&o.builtinWrite, "builtin-write", builtinWriteKubelet, "how the built-in side writes a pod's readiness: "+
		"\"kubelet\" as the kubelet's status manager (a GET, then a strategic merge patch of the status subresource), "+
		"\"update\" one status update (less than a kubelet sends: a lower bound of the built-in path)")
	flag.BoolVar(&o.apiServerGC, "apiserver-gc", false, "also read the API server's GC cycles during the sampling (the samples they overlap, "+
		"and the percentiles of the rest) and measure its allocation per flip of each side after it; the scrapes add a few MB of "+
		"allocation to the API server every 2 s")
	flag.StringVar(&o.samplesOut, "samples-out", "", "also write every sample to this CSV file (side, endpoints, round, address, direction, start and watch event as Unix nanoseconds, latency, phase and the built-in GET in nanoseconds)")
	flag.StringVar(&o.policies, "policies", "", "install the chart's admission policies from this file (tests/internal/cmd/renderchart; run.sh sets it unless POLICIES=0) and run the agent as its service account on its node, so that its slice writes pay the policies' CEL as in a cluster")
	flag.StringVar(&o.dataplane, "dataplane", "", "also measure until the dataplane routes the change: \"kube-proxy\" runs kube-proxy (nftables) in the cluster namespace and reads its rules as it writes them (nft monitor); "+
		"\"cilium\" runs cilium-agent as kube-proxy replacement there and polls its BPF service map every millisecond (needs tools/build.sh cilium and clang: hack/deps.sh --cilium); empty: the watch event only")
	flag.Parse()
	if o.dataplane != "" && o.dataplane != dataplaneKubeProxy && o.dataplane != dataplaneCilium {
		fmt.Fprintf(os.Stderr, "publish: -dataplane: %q is neither %q nor %q (nor empty)\n", o.dataplane, dataplaneKubeProxy, dataplaneCilium)
		os.Exit(2)
	}
	for s := range strings.SplitSeq(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 1000 {
			fmt.Fprintf(os.Stderr, "publish: -sizes: %q is not a number from 1 to 1000 (one slice holds at most 1000 endpoints)\n", s)
			os.Exit(2)
		}
		o.sizes = append(o.sizes, n)
	}
	if o.builtinWrite != builtinWriteKubelet && o.builtinWrite != builtinWriteUpdate {
		fmt.Fprintf(os.Stderr, "publish: -builtin-write: %q is neither %q nor %q\n", o.builtinWrite, builtinWriteKubelet, builtinWriteUpdate)
		os.Exit(2)
	}
	if o.agent == "" {
		fmt.Fprintln(os.Stderr, "publish: -agent is required")
		os.Exit(2)
	}
	os.Exit(run(o))
}

func run(o options) (code int) {
	c, err := cluster.New(cluster.Options{Nodes: []cluster.Node{
		{Name: agentNode, Zone: "zone-a"},
		{Name: kcmNode, Zone: "zone-a"},
	}, KubeProxy: o.dataplane == dataplaneKubeProxy, Cilium: o.dataplane == dataplaneCilium})
	if err != nil {
		fmt.Fprintln(os.Stderr, "publish:", err)
		return 1
	}
	defer func() {
		if err := c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "publish: stopping the cluster:", err)
			code = 1
		}
		if left := cluster.Leftovers(); len(left) > 0 {
			fmt.Fprintln(os.Stderr, "publish: left over:", left)
			code = 1
		}
	}()
	ctx := context.Background()
	b, err := newBench(ctx, c, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "publish:", err)
		return 1
	}
	defer b.stop()
	var results []sizeResult
	for _, n := range o.sizes {
		fmt.Fprintf(os.Stderr, "publish: %d endpoints\n", n)
		r, err := b.measure(ctx, n)
		if err != nil {
			fmt.Fprintf(os.Stderr, "publish: %d endpoints: %v\n", n, err)
			b.dumpLogs()
			return 1
		}
		results = append(results, r)
	}
	report(os.Stdout, o, results)
	if o.samplesOut != "" {
		if err := writeSamples(o.samplesOut, results); err != nil {
			fmt.Fprintln(os.Stderr, "publish:", err)
			return 1
		}
	}
	return 0
}

// Node names: the agent serves agentNode; the pods the built-in controller publishes run on
// kcmNode, so the agent never sees them.
const (
	agentNode = "node-a"
	kcmNode   = "node-b"
)

// startProc starts a program of the benchmark, its output in dir/<name>.log; stopped by its PID
// (SIGTERM, SIGKILL after 10 s).
func startProc(name, dir string, path string, args ...string) (*process.Process, error) {
	return process.Start(name, exec.Command(path, args...), process.Options{LogFile: filepath.Join(dir, name+".log"), Grace: 10 * time.Second})
}

// dumpLog prints the end of a program's output.
func dumpLog(p *process.Process) {
	fmt.Fprintf(os.Stderr, "--- %s output (tail) ---\n%s\n", p.Name(), p.Output(4000))
}

// kcmBinary is kube-controller-manager as tools/build.sh built it.
func kcmBinary() (string, error) { return controlplane.Binary("kube-controller-manager") }

func addrs(n int, f func(i int) netip.Addr) []netip.Addr {
	out := make([]netip.Addr, n)
	for i := range out {
		out[i] = f(i)
	}
	return out
}

var errTimeout = errors.New("timed out")
