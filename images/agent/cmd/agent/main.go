// Command agent is the per-node agent of service-with-healthchecks: it probes the pods of its
// own node that ServiceWithHealthchecks resources select and publishes them, per port, as
// EndpointSlices. See development/AGENT.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/lease"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == describeMetricsCommand {
		if err := describeMetrics(os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "agent: "+err.Error())
			os.Exit(1)
		}
		return
	}
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "agent: "+err.Error())
		os.Exit(1)
	}
}

// flags are the program's flags (DESIGN §12; the names are frozen).
type flags struct {
	nodeName               string
	kubeconfig             string
	metricsBindAddress     string
	healthProbeBindAddress string
	leaseNamespace         string
	leaseRenewInterval     time.Duration
	probeConcurrency       int
	kubeAPIQPS             float64
	kubeAPIBurst           int
	logLevel               string
}

func parse(args []string) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "Name of the node this agent serves (default $NODE_NAME); required.")
	fs.StringVar(&f.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "Path to a kubeconfig (default $KUBECONFIG, else the in-cluster config).")
	fs.StringVar(&f.metricsBindAddress, "metrics-bind-address", agent.DefaultMetricsBindAddress, "Address of the /metrics endpoint (\"0\" disables it); keep it on 127.0.0.1 behind kube-rbac-proxy.")
	fs.StringVar(&f.healthProbeBindAddress, "health-probe-bind-address", agent.DefaultHealthProbeBindAddress, "Address of the /healthz and /readyz endpoints (\"0\" disables them).")
	fs.StringVar(&f.leaseNamespace, "lease-namespace", agent.DefaultLeaseNamespace, "Namespace of the node Leases the agents renew.")
	fs.DurationVar(&f.leaseRenewInterval, "lease-renew-interval", lease.DefaultRenewInterval, "How often the node Lease is renewed; keep it well below the controller's --agent-lost-grace (a few renewals fit in one grace).")
	fs.IntVar(&f.probeConcurrency, "probe-concurrency", agent.DefaultProbeConcurrency, "Maximum number of probes running at once on this node.")
	fs.Float64Var(&f.kubeAPIQPS, "kube-api-qps", 20, "Queries per second to the API server.")
	fs.IntVar(&f.kubeAPIBurst, "kube-api-burst", 40, "Burst of queries to the API server.")
	fs.StringVar(&f.logLevel, "log-level", "info", "Log level: debug, info or error.")
	// Errors are reported in one line by main; only -help prints the flags.
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			_, _ = fmt.Fprintln(os.Stdout, "Usage of agent (service-with-healthchecks per-node agent):")
			fs.SetOutput(os.Stdout)
			fs.PrintDefaults()
		}
		return f, err
	}
	switch {
	case fs.NArg() > 0:
		return f, fmt.Errorf("unexpected arguments: %v", fs.Args())
	case f.nodeName == "":
		return f, fmt.Errorf("--node-name (or $NODE_NAME) is required")
	case f.leaseRenewInterval <= 0:
		return f, fmt.Errorf("--lease-renew-interval must be positive, not %s", f.leaseRenewInterval)
	case f.probeConcurrency < 1:
		return f, fmt.Errorf("--probe-concurrency must be at least 1, not %d", f.probeConcurrency)
	case f.kubeAPIQPS <= 0:
		return f, fmt.Errorf("--kube-api-qps must be positive, not %v", f.kubeAPIQPS)
	case f.kubeAPIBurst < 1:
		return f, fmt.Errorf("--kube-api-burst must be at least 1, not %d", f.kubeAPIBurst)
	}
	if _, err := logger(f.logLevel); err != nil {
		return f, err
	}
	return f, nil
}

// logger builds the logger; debug shows logr V-levels up to 5 (every probe at V(4)).
func logger(level string) (logr.Logger, error) {
	var l zapcore.Level
	switch level {
	case "debug":
		l = zapcore.Level(-5)
	case "info":
		l = zapcore.InfoLevel
	case "error":
		l = zapcore.ErrorLevel
	default:
		return logr.Logger{}, fmt.Errorf("--log-level must be debug, info or error, not %q", level)
	}
	return zap.New(zap.Level(l)), nil
}

func run(args []string) error {
	f, err := parse(args)
	if err != nil {
		return err
	}
	log, _ := logger(f.logLevel)
	ctrl.SetLogger(log)

	loading := clientcmd.NewDefaultClientConfigLoadingRules()
	loading.ExplicitPath = f.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loading, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return fmt.Errorf("loading the API server config: %w", err)
	}
	cfg.QPS, cfg.Burst = float32(f.kubeAPIQPS), f.kubeAPIBurst
	cfg.UserAgent = "service-with-healthchecks-agent/" + f.nodeName

	a, err := agent.New(agent.Options{
		NodeName:               f.nodeName,
		Config:                 cfg,
		MetricsBindAddress:     f.metricsBindAddress,
		HealthProbeBindAddress: f.healthProbeBindAddress,
		LeaseNamespace:         f.leaseNamespace,
		LeaseRenewInterval:     f.leaseRenewInterval,
		ProbeConcurrency:       f.probeConcurrency,
		Logger:                 log,
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Info("starting", "node", f.nodeName)
	return a.Run(ctx)
}
