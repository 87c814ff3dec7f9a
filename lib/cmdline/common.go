// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cmdline

import (
	"fmt"
	"net"
	"strconv"

	"github.com/spf13/pflag"
)

// Defaults are a program's defaults for the shared flags.
type Defaults struct {
	// MetricsBindAddress is the default --metrics-bind-address (a loopback address or "0").
	MetricsBindAddress string
	// HealthProbeBindAddress is the default --health-probe-bind-address.
	HealthProbeBindAddress string
	// KubeAPIQPS and KubeAPIBurst are the defaults of --kube-api-qps and --kube-api-burst.
	KubeAPIQPS   float32
	KubeAPIBurst int
}

// Common are the flags both programs have, with the same names, meaning and checks.
type Common struct {
	// Kubeconfig is the kubeconfig file or a list of them ($KUBECONFIG's form); empty means
	// the in-cluster configuration.
	Kubeconfig string
	// MetricsBindAddress is where metrics are served: a loopback address, or "0" for none.
	MetricsBindAddress string
	// HealthProbeBindAddress is where /healthz and /readyz are served, or "0" for none.
	HealthProbeBindAddress string
	// KubeAPIQPS and KubeAPIBurst limit the program's requests to the API server (client-go's
	// own default, 5/10, made 1,000 resources take minutes: development/BENCHMARKS.md).
	KubeAPIQPS   float32
	KubeAPIBurst int
	// LogLevel is the lowest level logged.
	LogLevel LogLevel
}

// AddFlags defines the shared flags on fs with the program's defaults; getenv supplies
// $KUBECONFIG, the default of --kubeconfig.
func (c *Common) AddFlags(fs *pflag.FlagSet, getenv func(string) string, d Defaults) {
	fs.StringVar(&c.Kubeconfig, "kubeconfig", getenv("KUBECONFIG"),
		"Kubeconfig `file`, or a list of them joined like $KUBECONFIG and merged like kubectl does (default $KUBECONFIG). Empty: the in-cluster service account.")
	fs.StringVar(&c.MetricsBindAddress, "metrics-bind-address", d.MetricsBindAddress,
		"Listen `address` of the Prometheus /metrics endpoint. Must be a loopback address (127.0.0.1, ::1, localhost): metrics leave the pod only through kube-rbac-proxy. \"0\" turns metrics off.")
	fs.StringVar(&c.HealthProbeBindAddress, "health-probe-bind-address", d.HealthProbeBindAddress,
		"Listen `address` of the /healthz and /readyz endpoints (nothing else is served there); the kubelet must reach it. \"0\" turns them off.")
	fs.Float32Var(&c.KubeAPIQPS, "kube-api-qps", d.KubeAPIQPS,
		"Queries per second the program may send to the API server (a client-side limit).")
	fs.IntVar(&c.KubeAPIBurst, "kube-api-burst", d.KubeAPIBurst,
		"Burst of queries to the API server above --kube-api-qps.")
	c.LogLevel = LogInfo
	fs.Var(&c.LogLevel, "log-level",
		"Lowest log `level`: debug (also logr V-levels up to 5, such as every probe), info, warn or error. Logs are JSON lines on stderr.")
}

// Check checks the values of the shared flags; every error is a usage error naming the flag.
func (c *Common) Check() error {
	if c.MetricsBindAddress != "0" {
		host, port, err := net.SplitHostPort(c.MetricsBindAddress)
		if err != nil {
			return Usagef("--metrics-bind-address %q: %w", c.MetricsBindAddress, err)
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return Usagef("--metrics-bind-address %q: must be a loopback address such as 127.0.0.1:8080 (metrics leave the pod only through kube-rbac-proxy)", c.MetricsBindAddress)
		}
		if err := checkPort(port); err != nil {
			return Usagef("--metrics-bind-address %q: %w", c.MetricsBindAddress, err)
		}
	}
	if c.HealthProbeBindAddress != "0" {
		_, port, err := net.SplitHostPort(c.HealthProbeBindAddress)
		if err != nil {
			return Usagef("--health-probe-bind-address %q: %w", c.HealthProbeBindAddress, err)
		}
		if err := checkPort(port); err != nil {
			return Usagef("--health-probe-bind-address %q: %w", c.HealthProbeBindAddress, err)
		}
	}
	if c.KubeAPIQPS <= 0 {
		return Usagef("--kube-api-qps %v: must be positive", c.KubeAPIQPS)
	}
	if c.KubeAPIBurst < 1 {
		return Usagef("--kube-api-burst %d: must be at least 1", c.KubeAPIBurst)
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
