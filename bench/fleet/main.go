// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Command fleet measures the controller program (images/controller/cmd/controller) in a
// simulated cluster (issue 19 part 6): against a real kube-apiserver it makes Node objects for
// many nodes, renews an agent Lease for each of them on the agents' schedule, and publishes, for
// a few resources, a slice on every node the way the agents do. Then it measures the controller
// at steady state (CPU over a window, RSS, its API requests), the time to withdraw the
// endpoints of some nodes whose Leases stop, the same steady state while they are stale, and a
// burst of many resources created at once (time until every status is set, writes per
// resource, RSS). Given a second build (-baseline), it alternates the two, round by round, each
// on a fresh control plane. It prints a markdown section (development/BENCHMARKS-HISTORY.md,
// "Controller at cluster scale").
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

// options are the command line.
type options struct {
	controller, baseline string
	controllerArgs       string
	candidateArgs        string
	nodes                int
	resources            int
	stale                int
	burst                int
	rounds               int
	renew                time.Duration
	grace                time.Duration
	window               time.Duration
	staleWindow          time.Duration
	settle               time.Duration
	timeout              time.Duration
	writers              int
	serviceCIDR          string
	phases               map[string]bool
}

// The phases of a round, in their order; -phases picks some (the fleet is always made).
const (
	phaseSteady = "steady"
	phaseStale  = "stale"
	phaseBurst  = "burst"
)

func main() {
	var o options
	var phases string
	flag.StringVar(&o.controller, "controller", "", "the controller program to measure (required)")
	flag.StringVar(&o.baseline, "baseline", "", "a second controller program to compare with, e.g. built from another git revision (optional)")
	flag.StringVar(&o.controllerArgs, "controller-args", "", "extra arguments for both builds, space separated")
	flag.StringVar(&o.candidateArgs, "candidate-args", "", "extra arguments for -controller only (flags the baseline may not know), space separated")
	flag.IntVar(&o.nodes, "nodes", 1000, "simulated nodes: Node objects with an agent Lease each")
	flag.IntVar(&o.resources, "resources", 10, "resources with a slice on every node")
	flag.IntVar(&o.stale, "stale", 10, "nodes whose Leases stop being renewed in the stale phase")
	flag.IntVar(&o.burst, "burst", 10000, "resources created at once in the burst phase")
	flag.IntVar(&o.rounds, "rounds", 2, "rounds per build, builds alternating")
	flag.DurationVar(&o.renew, "renew", 10*time.Second, "how often each simulated agent renews its Lease (the agent's period)")
	flag.DurationVar(&o.grace, "grace", 40*time.Second, "the controller's --agent-lost-grace (its default)")
	flag.DurationVar(&o.window, "window", 60*time.Second, "steady state: CPU is measured over this window")
	flag.DurationVar(&o.staleWindow, "stale-window", 60*time.Second, "the same while the stale nodes stay stale")
	flag.DurationVar(&o.settle, "settle", 3*time.Second, "a phase ends once the controller's counters stayed flat this long")
	flag.DurationVar(&o.timeout, "timeout", time.Hour, "give up on a phase after this long")
	flag.IntVar(&o.writers, "writers", 32, "concurrent clients that make the fleet and the burst")
	flag.StringVar(&o.serviceCIDR, "service-cidr", "10.96.0.0/16", "kube-apiserver --service-cluster-ip-range (allocation only: no traffic is sent)")
	flag.StringVar(&phases, "phases", "steady,stale,burst", "phases to run, in their fixed order")
	flag.Parse()
	if err := o.check(phases); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(2)
	}
	builds := []string{"candidate"}
	bins := map[string]string{"candidate": o.controller}
	if o.baseline != "" {
		builds = append(builds, "baseline")
		bins["baseline"] = o.baseline
	}
	results := map[string][]result{}
	for r := 1; r <= o.rounds; r++ {
		// Alternate which build goes first, so a drift of the machine hits both alike.
		order := slices.Clone(builds)
		if r%2 == 0 {
			slices.Reverse(order)
		}
		for _, b := range order {
			args := strings.Fields(o.controllerArgs)
			if b == "candidate" {
				args = append(args, strings.Fields(o.candidateArgs)...)
			}
			fmt.Fprintf(os.Stderr, "fleet: round %d of %d, %s (load %s)\n", r, o.rounds, b, process.LoadAvg())
			res, err := round(o, bins[b], args)
			if err != nil {
				fmt.Fprintf(os.Stderr, "fleet: round %d, %s: %v\n", r, b, err)
				os.Exit(1)
			}
			fmt.Fprintf(os.Stderr, "fleet: round %d, %s: %s\n", r, b, res)
			results[b] = append(results[b], res)
		}
	}
	report(os.Stdout, o, builds, results)
}

func (o *options) check(phases string) error {
	if o.controller == "" {
		return fmt.Errorf("-controller is required")
	}
	if o.nodes < 1 || o.resources < 1 || o.rounds < 1 || o.writers < 1 {
		return fmt.Errorf("-nodes, -resources, -rounds and -writers must be at least 1")
	}
	if o.stale < 0 || o.burst < 0 {
		return fmt.Errorf("-stale and -burst must not be negative")
	}
	if 2*o.stale > o.nodes {
		return fmt.Errorf("-stale %d of -nodes %d is more than half: the liveness guard would hold and nothing be withdrawn", o.stale, o.nodes)
	}
	if o.renew <= 0 || o.grace <= 2*o.renew {
		return fmt.Errorf("-grace %s must be more than twice -renew %s, or live agents would look stale", o.grace, o.renew)
	}
	o.phases = map[string]bool{}
	for p := range strings.SplitSeq(phases, ",") {
		p = strings.TrimSpace(p)
		switch p {
		case phaseSteady, phaseStale, phaseBurst:
			o.phases[p] = true
		case "":
		default:
			return fmt.Errorf("-phases: unknown phase %q (steady, stale, burst)", p)
		}
	}
	return nil
}
