// Package config parses and checks the controller's command line (DESIGN §12).
package config

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap/zapcore"
)

// DefaultNamespace is the module namespace: leader election and the agents' Leases live there.
const DefaultNamespace = "d8-service-with-healthchecks"

// Config is the controller's configuration.
type Config struct {
	// Kubeconfig is the kubeconfig file; empty means $KUBECONFIG, then the in-cluster config.
	Kubeconfig string
	// MetricsBindAddress is where metrics are served: a loopback address, or "0" for none.
	MetricsBindAddress string
	// HealthProbeBindAddress is where /healthz and /readyz are served, or "0" for none.
	HealthProbeBindAddress string
	// LeaderElect turns leader election on.
	LeaderElect bool
	// LeaderElectionNamespace holds the leader election Lease.
	LeaderElectionNamespace string
	// AgentLeaseNamespace holds the agents' per-node Leases.
	AgentLeaseNamespace string
	// AgentLostGrace is how long an agent's Lease may stay unrenewed before its node's endpoints
	// are withdrawn.
	AgentLostGrace time.Duration
	// KubeAPIQPS and KubeAPIBurst limit this client's requests to the API server (client-go's
	// own default, 5/10, made 1,000 resources take minutes: development/BENCHMARKS.md).
	KubeAPIQPS   float32
	KubeAPIBurst int
	// LogLevel is the lowest level logged.
	LogLevel zapcore.Level
}

// Client-side API rate limits (--kube-api-qps, --kube-api-burst).
const (
	DefaultKubeAPIQPS   = 50
	DefaultKubeAPIBurst = 100
)

// ErrHelp is returned by Parse when --help was asked for; the usage was written to out.
var ErrHelp = pflag.ErrHelp

// Parse parses the arguments (without the program name). getenv supplies $KUBECONFIG. On --help
// it writes the usage to out and returns ErrHelp. Any other error is one line that names the
// flag and the reason.
func Parse(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	var c Config
	var logLevel string
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.SortFlags = false
	fs.StringVar(&c.Kubeconfig, "kubeconfig", getenv("KUBECONFIG"),
		"Path to a kubeconfig file (default $KUBECONFIG); when empty, the in-cluster service account is used.")
	fs.StringVar(&c.MetricsBindAddress, "metrics-bind-address", "127.0.0.1:8080",
		"Address of the Prometheus metrics endpoint. Must be a loopback address: metrics leave the pod only through kube-rbac-proxy. \"0\" turns metrics off.")
	fs.StringVar(&c.HealthProbeBindAddress, "health-probe-bind-address", ":8081",
		"Address of the /healthz and /readyz endpoints (nothing else is served there); the kubelet must reach it. \"0\" turns them off.")
	fs.BoolVar(&c.LeaderElect, "leader-elect", true,
		"Elect a leader through a Lease so that only one replica writes; turn off only when a single replica runs.")
	fs.StringVar(&c.LeaderElectionNamespace, "leader-election-namespace", DefaultNamespace,
		"Namespace of the leader election Lease.")
	fs.StringVar(&c.AgentLeaseNamespace, "agent-lease-namespace", DefaultNamespace,
		"Namespace where every agent renews a Lease for its node.")
	fs.DurationVar(&c.AgentLostGrace, "agent-lost-grace", 40*time.Second,
		"How long an agent's Lease may go unrenewed, as seen by this controller's own clock, before the endpoints of its node are withdrawn.")
	fs.Float32Var(&c.KubeAPIQPS, "kube-api-qps", DefaultKubeAPIQPS,
		"Queries per second this controller may send to the API server (client-side limit).")
	fs.IntVar(&c.KubeAPIBurst, "kube-api-burst", DefaultKubeAPIBurst,
		"Burst of queries above --kube-api-qps.")
	fs.StringVar(&logLevel, "log-level", "info",
		"Lowest log level: debug, info, warn or error (logs are JSON on stderr).")
	fs.Usage = func() {}

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			_, _ = fmt.Fprintf(out, "Usage: controller [flags]\n\n"+
				"Keeps, for every ServiceWithHealthchecks, a Service of the same name with an empty selector,\n"+
				"writes the resource's status and removes EndpointSlices that belong to nothing.\n\nFlags:\n%s",
				fs.FlagUsages())
			return Config{}, ErrHelp
		}
		return Config{}, oneLine(err)
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q: the controller takes flags only", fs.Arg(0))
	}
	lvl, err := zapcore.ParseLevel(logLevel)
	if err != nil || lvl < zapcore.DebugLevel || lvl > zapcore.ErrorLevel {
		return Config{}, fmt.Errorf("--log-level %q: must be debug, info, warn or error", logLevel)
	}
	c.LogLevel = lvl
	if err := c.check(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func (c *Config) check() error {
	if c.MetricsBindAddress != "0" {
		host, port, err := net.SplitHostPort(c.MetricsBindAddress)
		if err != nil {
			return fmt.Errorf("--metrics-bind-address %q: %w", c.MetricsBindAddress, err)
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return fmt.Errorf("--metrics-bind-address %q: must be a loopback address such as 127.0.0.1:8080 (metrics leave the pod only through kube-rbac-proxy)", c.MetricsBindAddress)
		}
		if err := checkPort(port); err != nil {
			return fmt.Errorf("--metrics-bind-address %q: %w", c.MetricsBindAddress, err)
		}
	}
	if c.HealthProbeBindAddress != "0" {
		_, port, err := net.SplitHostPort(c.HealthProbeBindAddress)
		if err != nil {
			return fmt.Errorf("--health-probe-bind-address %q: %w", c.HealthProbeBindAddress, err)
		}
		if err := checkPort(port); err != nil {
			return fmt.Errorf("--health-probe-bind-address %q: %w", c.HealthProbeBindAddress, err)
		}
	}
	if c.LeaderElect && c.LeaderElectionNamespace == "" {
		return errors.New("--leader-election-namespace: must not be empty when --leader-elect is on")
	}
	if c.AgentLeaseNamespace == "" {
		return errors.New("--agent-lease-namespace: must not be empty")
	}
	if c.AgentLostGrace <= 0 {
		return fmt.Errorf("--agent-lost-grace %s: must be positive", c.AgentLostGrace)
	}
	if c.KubeAPIQPS <= 0 {
		return fmt.Errorf("--kube-api-qps %v: must be positive", c.KubeAPIQPS)
	}
	if c.KubeAPIBurst < 1 {
		return fmt.Errorf("--kube-api-burst %d: must be at least 1", c.KubeAPIBurst)
	}
	return nil
}

func checkPort(port string) error {
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}

// oneLine keeps pflag's message on one line.
func oneLine(err error) error {
	return errors.New(strings.Join(strings.Fields(err.Error()), " "))
}
