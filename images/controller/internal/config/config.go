// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package config parses and checks the controller's command line (DESIGN §12) on the module's
// one command-line stack (lib/cmdline): the flags the programs share and the controller's own.
package config

import (
	"io"
	"time"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/lib/cmdline"
)

// Program is the program's name, the first word of every line it reports on stderr.
const Program = "controller"

// DefaultNamespace is the module namespace: leader election and the agents' Leases live there.
const DefaultNamespace = wellknown.Namespace

// Client-side API rate limits (--kube-api-qps, --kube-api-burst).
const (
	DefaultKubeAPIQPS   = 50
	DefaultKubeAPIBurst = 100
)

// Reconcile workers (--max-concurrent-reconciles): the default, and the most accepted (more
// would only queue on the API rate limit and the API server; a larger number is a typo).
const (
	DefaultMaxConcurrentReconciles = 1
	MaxMaxConcurrentReconciles     = 64
)

// MinAgentLostGrace is the shortest --agent-lost-grace accepted, the module setting's minimum
// (hooks/settings). The liveness guard counts an agent silent for more than half the grace as
// late; a live agent renews every quarter of the grace and is observed every eighth of it,
// but no more often than every 0.5 s, so below about 2 s a live agent could look late. 4 s keeps a margin.
const MinAgentLostGrace = 4 * time.Second

// Config is the controller's configuration.
type Config struct {
	// Common are the flags the controller shares with the agent: kubeconfig, API rate limits,
	// metrics and health addresses, log level.
	cmdline.Common
	// LeaderElect turns leader election on.
	LeaderElect bool
	// LeaderElectionNamespace holds the leader election Lease.
	LeaderElectionNamespace string
	// AgentLeaseNamespace holds the agents' per-node Leases.
	AgentLeaseNamespace string
	// AgentLostGrace is how long an agent's Lease may stay unrenewed before its node's endpoints
	// are withdrawn.
	AgentLostGrace time.Duration
	// MaxConcurrentReconciles is how many resources are reconciled at once.
	MaxConcurrentReconciles int
}

// ErrHelp is returned by Parse when --help was asked for; the help was written to out.
var ErrHelp = cmdline.ErrHelp

// Parse parses the arguments (without the program name). getenv supplies $KUBECONFIG. On --help
// it writes the help to out and returns ErrHelp. Any other error is a usage error
// (cmdline.Report exits 2 with it) on one line that names the flag and the reason.
func Parse(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	var c Config
	p := cmdline.New(Program,
		"Keeps, for every ServiceWithHealthchecks, a Service of the same name with an empty selector,\n"+
			"writes the resource's status and removes EndpointSlices that belong to nothing.")
	c.AddFlags(p.Flags, getenv, cmdline.Defaults{
		MetricsBindAddress:     "127.0.0.1:8080",
		HealthProbeBindAddress: ":8081",
		KubeAPIQPS:             DefaultKubeAPIQPS,
		KubeAPIBurst:           DefaultKubeAPIBurst,
	})
	p.Flags.BoolVar(&c.LeaderElect, "leader-elect", true,
		"Elect a leader through a Lease so that only one replica writes; turn off only when a single replica runs.")
	p.Flags.StringVar(&c.LeaderElectionNamespace, "leader-election-namespace", DefaultNamespace,
		"The `namespace` of the leader election Lease.")
	p.Flags.StringVar(&c.AgentLeaseNamespace, "agent-lease-namespace", DefaultNamespace,
		"The `namespace` where every agent renews a Lease for its node.")
	p.Flags.DurationVar(&c.AgentLostGrace, "agent-lost-grace", 40*time.Second,
		"How long an agent's Lease may go unrenewed, as seen by this controller's own clock, before the endpoints of its node are withdrawn; at least "+MinAgentLostGrace.String()+".")
	p.Flags.IntVar(&c.MaxConcurrentReconciles, "max-concurrent-reconciles", DefaultMaxConcurrentReconciles,
		"How many resources are reconciled at once (1 to 64). More help only when the API server's latency, not --kube-api-qps, bounds how fast many new resources settle.")
	if err := p.Parse(args, out); err != nil {
		return Config{}, err
	}
	if err := c.check(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func (c *Config) check() error {
	if err := c.Check(); err != nil { // the shared flags
		return err
	}
	if c.LeaderElect && c.LeaderElectionNamespace == "" {
		return cmdline.Usagef("--leader-election-namespace: must not be empty when --leader-elect is on")
	}
	if c.AgentLeaseNamespace == "" {
		return cmdline.Usagef("--agent-lease-namespace: must not be empty")
	}
	if c.AgentLostGrace < MinAgentLostGrace {
		return cmdline.Usagef("--agent-lost-grace %s: must be at least %s (agents renew every quarter of it, and one silent for half of it counts as late)", c.AgentLostGrace, MinAgentLostGrace)
	}
	if c.MaxConcurrentReconciles < 1 || c.MaxConcurrentReconciles > MaxMaxConcurrentReconciles {
		return cmdline.Usagef("--max-concurrent-reconciles %d: must be between 1 and %d", c.MaxConcurrentReconciles, MaxMaxConcurrentReconciles)
	}
	return nil
}
