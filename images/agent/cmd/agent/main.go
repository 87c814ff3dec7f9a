// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Command agent is the per-node agent of service-with-healthchecks: it probes the pods of its
// own node that ServiceWithHealthchecks resources select and publishes them, per port, as
// EndpointSlices. See development/AGENT.md.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/lease"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/sliceplan"
	"github.com/deckhouse/service-with-healthchecks/lib/cmdline"
	"github.com/deckhouse/service-with-healthchecks/lib/memlimit"
)

// program is the program's name, the first word of every line it reports on stderr.
const program = "agent"

// Client-side API rate limits (--kube-api-qps, --kube-api-burst): one agent per node, so lower
// than the controller's.
const (
	defaultKubeAPIQPS   = 20
	defaultKubeAPIBurst = 40
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cmdline.Report(os.Stderr, program, run(ctx, os.Args[1:], os.Getenv, os.Stdout))
	stop()
	os.Exit(code)
}

// flags are the program's flags (DESIGN §12; the names are frozen).
type flags struct {
	// Common are the flags the agent shares with the controller: kubeconfig, API rate limits,
	// metrics and health addresses, log level.
	cmdline.Common
	nodeName           string
	leaseNamespace     string
	leaseRenewInterval time.Duration
	probeConcurrency   int
	maxProbeTargets    int
	maxEndpoints       int
}

// parse parses the arguments (without the program name); getenv supplies $NODE_NAME and
// $KUBECONFIG. On --help it writes the help to stdout and returns cmdline.ErrHelp; every other
// error is a usage error on one line.
func parse(args []string, getenv func(string) string, stdout io.Writer) (flags, error) {
	var f flags
	p := cmdline.New(program,
		"The per-node agent of service-with-healthchecks: probes the pods of its own node that\n"+
			"ServiceWithHealthchecks resources select and publishes them, per port, as EndpointSlices.")
	f.AddFlags(p.Flags, getenv, cmdline.Defaults{
		MetricsBindAddress:     agent.DefaultMetricsBindAddress,
		HealthProbeBindAddress: agent.DefaultHealthProbeBindAddress,
		KubeAPIQPS:             defaultKubeAPIQPS,
		KubeAPIBurst:           defaultKubeAPIBurst,
	})
	p.Flags.StringVar(&f.nodeName, "node-name", getenv("NODE_NAME"),
		"The `name` of the node this agent serves (default $NODE_NAME); required.")
	p.Flags.StringVar(&f.leaseNamespace, "lease-namespace", agent.DefaultLeaseNamespace,
		"The `namespace` of the node Leases the agents renew (the controller's --agent-lease-namespace).")
	p.Flags.DurationVar(&f.leaseRenewInterval, "lease-renew-interval", lease.DefaultRenewInterval,
		"How often the node Lease is renewed; keep it well below the controller's --agent-lost-grace (a few renewals fit in one grace).")
	p.Flags.IntVar(&f.probeConcurrency, "probe-concurrency", agent.DefaultProbeConcurrency,
		"Maximum number of probes running at once on this node.")
	p.Flags.IntVar(&f.maxProbeTargets, "max-probe-targets", agent.DefaultMaxProbeTargets,
		"The probe budget: the most probe targets (pod × probe) this agent keeps, shared fairly between namespaces; "+
			"targets beyond a namespace's share are not probed and their ports are published not serving.")
	p.Flags.IntVar(&f.maxEndpoints, "max-endpoints-per-slice", sliceplan.DefaultMaxEndpointsPerSlice,
		"The most endpoints one EndpointSlice holds: a port's endpoints on this node beyond it are published in further slices (chunks), "+
			"as the built-in EndpointSlice controller does (its default too); 1 to 1000.")
	if err := p.Parse(args, stdout); err != nil {
		return flags{}, err
	}
	if err := f.check(); err != nil {
		return flags{}, err
	}
	return f, nil
}

func (f *flags) check() error {
	if err := f.Check(); err != nil { // the shared flags
		return err
	}
	switch {
	case f.nodeName == "":
		return cmdline.Usagef("--node-name: required (set the flag or $NODE_NAME)")
	case f.leaseNamespace == "":
		return cmdline.Usagef("--lease-namespace: must not be empty")
	case f.leaseRenewInterval <= 0:
		return cmdline.Usagef("--lease-renew-interval %s: must be positive", f.leaseRenewInterval)
	case f.probeConcurrency < 1:
		return cmdline.Usagef("--probe-concurrency %d: must be at least 1", f.probeConcurrency)
	case f.maxProbeTargets < 1:
		return cmdline.Usagef("--max-probe-targets %d: must be at least 1", f.maxProbeTargets)
	case f.maxEndpoints < 1 || f.maxEndpoints > sliceplan.MaxOfMaxEndpointsPerSlice:
		return cmdline.Usagef("--max-endpoints-per-slice %d: must be 1 to %d", f.maxEndpoints, sliceplan.MaxOfMaxEndpointsPerSlice)
	}
	return nil
}

// run is the program: its hidden describe-metrics command, or flags → logger, API server
// configuration → the agent until ctx ends. Its error decides the exit code (cmdline.Report).
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) == 1 && args[0] == describeMetricsCommand {
		return describeMetrics(stdout)
	}
	f, err := parse(args, getenv, stdout)
	if err != nil {
		return err
	}
	log := f.SetupLogger(os.Stderr)
	memlimit.Set(getenv)
	cfg, err := f.RESTConfig("service-with-healthchecks-agent/" + f.nodeName)
	if err != nil {
		return err
	}
	a, err := agent.New(agent.Options{
		NodeName:               f.nodeName,
		Config:                 cfg,
		MetricsBindAddress:     f.MetricsBindAddress,
		HealthProbeBindAddress: f.HealthProbeBindAddress,
		LeaseNamespace:         f.leaseNamespace,
		LeaseRenewInterval:     f.leaseRenewInterval,
		ProbeConcurrency:       f.probeConcurrency,
		MaxProbeTargets:        f.maxProbeTargets,
		MaxEndpointsPerSlice:   f.maxEndpoints,
		Logger:                 log,
	})
	if err != nil {
		return err
	}
	log.Info("starting", "node", f.nodeName)
	return a.Run(ctx)
}
