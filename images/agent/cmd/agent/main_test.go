// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/lib/cmdline"
	"github.com/deckhouse/service-with-healthchecks/lib/cmdline/cmdlinetest"
)

// TestMain runs the program itself when asked, so tests can check its exit code and output.
func TestMain(m *testing.M) {
	if os.Getenv("SWH_AGENT_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// programCmd is the program (this test binary running main) with args, without $KUBECONFIG.
func programCmd(t *testing.T, env []string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
	cmd.Env = append(os.Environ(), append([]string{"SWH_AGENT_RUN_MAIN=1", "KUBECONFIG="}, env...)...)
	return cmd
}

func TestBadFlagsExitWithOneLine(t *testing.T) {
	tests := map[string]struct {
		env      []string
		args     []string
		wantCode int
		want     string
	}{
		"a missing node name is a usage error": {
			env: []string{"NODE_NAME="}, args: []string{"--kubeconfig=/nonexistent"},
			wantCode: 2, want: "agent: --node-name: required (set the flag or $NODE_NAME) (see --help)\n",
		},
		"an unknown flag is a usage error": {
			env: []string{"NODE_NAME=node-a"}, args: []string{"--bogus"}, wantCode: 2, want: "agent: unknown flag: --bogus (see --help)\n",
		},
		"a single-dash flag of the old flag package is a usage error": {
			env: []string{"NODE_NAME=node-a"}, args: []string{"-node-name=node-a"}, wantCode: 2, want: "agent: unknown shorthand flag: 'n' in -node-name=node-a (see --help)\n",
		},
		"an unknown log level is a usage error": {
			env: []string{"NODE_NAME=node-a"}, args: []string{"--log-level=trace"},
			wantCode: 2, want: `agent: invalid argument "trace" for "--log-level" flag: must be debug, info, warn or error (see --help)` + "\n",
		},
		"metrics off the loopback are refused": {
			env: []string{"NODE_NAME=node-a"}, args: []string{"--metrics-bind-address=0.0.0.0:9781"}, wantCode: 2, want: "must be a loopback address",
		},
		"no cluster to talk to is a failure": {
			env: []string{"NODE_NAME=node-a", "KUBERNETES_SERVICE_HOST="}, wantCode: 1, want: "agent: no --kubeconfig or $KUBECONFIG and not running in a cluster",
		},
		"a missing kubeconfig file is a failure": {
			env: []string{"NODE_NAME=node-a"}, args: []string{"--kubeconfig=/nonexistent/kubeconfig"}, wantCode: 1, want: "agent: loading kubeconfig /nonexistent/kubeconfig: ",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cmdlinetest.ExitsWithOneLine(t, programCmd(t, tc.env, tc.args...), "agent", tc.wantCode, tc.want)
		})
	}
}

func TestHelpListsEveryFlagOnStdout(t *testing.T) {
	var stdout, stderr bytes.Buffer
	cmd := programCmd(t, []string{"NODE_NAME="}, "--help")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "--help exits 0, even without a node name")
	assert.Empty(t, stderr.String())
	listed := map[string]string{}
	for l := range strings.SplitSeq(stdout.String(), "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], "--") {
			listed[f[0]] = l
		}
	}
	want := map[string]string{ // every flag, with its default where it has one
		"--node-name":                 "(default $NODE_NAME)",
		"--kubeconfig":                "(default $KUBECONFIG)",
		"--metrics-bind-address":      `(default "127.0.0.1:9781")`,
		"--health-probe-bind-address": `(default "127.0.0.1:9782")`,
		"--lease-namespace":           `(default "d8-service-with-healthchecks")`,
		"--lease-renew-interval":      "(default 10s)",
		"--probe-concurrency":         "(default 64)",
		"--max-probe-targets":         "(default 20000)",
		"--max-endpoints-per-slice":   "(default 100)",
		"--kube-api-qps":              "(default 20)",
		"--kube-api-burst":            "(default 40)",
		"--log-level":                 "(default info)",
		"--help":                      "Print this help",
		"--version":                   "Print the version",
	}
	for flag, text := range want {
		assert.Contains(t, listed[flag], text, "--help documents %s", flag)
	}
	assert.Len(t, listed, len(want), "no flag is left out of the test: %v", listed)
}

func TestVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	cmd := programCmd(t, []string{"NODE_NAME="}, "--version")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "--version exits 0, even without a node name")
	assert.Empty(t, stderr.String())
	assert.Equal(t, "agent dev (revision unknown, "+runtime.Version()+")\n", stdout.String(), "a build without -ldflags is dev")
}

func TestParse(t *testing.T) {
	tests := map[string]struct {
		nodeEnv string
		args    []string
		want    string // usage error text; empty when the flags are valid
	}{
		"the node name comes from the flag":        {args: []string{"--node-name=node-a"}},
		"the node name defaults to NODE_NAME":      {nodeEnv: "node-a"},
		"the flag wins over NODE_NAME":             {nodeEnv: "node-b", args: []string{"--node-name=node-a"}},
		"a missing node name is an error":          {want: "--node-name: required (set the flag or $NODE_NAME)"},
		"an unknown flag is an error":              {nodeEnv: "node-a", args: []string{"--bogus"}, want: "unknown flag: --bogus"},
		"a zero probe concurrency is an error":     {nodeEnv: "node-a", args: []string{"--probe-concurrency=0"}, want: "--probe-concurrency 0: must be at least 1"},
		"a zero probe budget is an error":          {nodeEnv: "node-a", args: []string{"--max-probe-targets=0"}, want: "--max-probe-targets 0: must be at least 1"},
		"a slice holds at most 1000 endpoints":     {nodeEnv: "node-a", args: []string{"--max-endpoints-per-slice=1001"}, want: "--max-endpoints-per-slice 1001: must be 1 to 1000"},
		"a slice holds at least one endpoint":      {nodeEnv: "node-a", args: []string{"--max-endpoints-per-slice=0"}, want: "--max-endpoints-per-slice 0: must be 1 to 1000"},
		"an unknown log level is an error":         {nodeEnv: "node-a", args: []string{"--log-level=trace"}, want: `invalid argument "trace" for "--log-level" flag: must be debug, info, warn or error`},
		"warn is a log level of both programs":     {nodeEnv: "node-a", args: []string{"--log-level=warn"}},
		"every flag the chart renders is accepted": {args: []string{"--node-name=n", "--metrics-bind-address=127.0.0.1:9781", "--health-probe-bind-address=127.0.0.1:9782", "--lease-namespace=d8-service-with-healthchecks", "--probe-concurrency=64", "--max-probe-targets=20000", "--kube-api-qps=20", "--kube-api-burst=40", "--log-level=debug"}},
		"flag values may follow as arguments":      {args: []string{"--node-name", "n", "--kubeconfig", "/k", "--lease-namespace", "ns", "--log-level", "error"}},
		"a stray argument is an error":             {nodeEnv: "node-a", args: []string{"extra"}, want: `unexpected argument "extra": agent takes flags only`},
		"a non-positive API rate is an error":      {nodeEnv: "node-a", args: []string{"--kube-api-qps=0"}, want: "--kube-api-qps 0: must be positive"},
		"a burst below one is an error":            {nodeEnv: "node-a", args: []string{"--kube-api-burst=0"}, want: "--kube-api-burst 0: must be at least 1"},
		"a short lease renewal is accepted":        {nodeEnv: "node-a", args: []string{"--lease-renew-interval=500ms"}},
		"a zero lease renewal is an error":         {nodeEnv: "node-a", args: []string{"--lease-renew-interval=0s"}, want: "--lease-renew-interval 0s: must be positive"},
		"an empty lease namespace is an error":     {nodeEnv: "node-a", args: []string{"--lease-namespace="}, want: "--lease-namespace: must not be empty"},
		"metrics on the pod network are refused":   {nodeEnv: "node-a", args: []string{"--metrics-bind-address=:9781"}, want: `--metrics-bind-address ":9781": must be a loopback address`},
		"metrics can be turned off":                {nodeEnv: "node-a", args: []string{"--metrics-bind-address=0", "--health-probe-bind-address=0"}},
		"health on a port that is no number":       {nodeEnv: "node-a", args: []string{"--health-probe-bind-address=127.0.0.1:health"}, want: "--health-probe-bind-address"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			getenv := func(k string) string {
				if k == "NODE_NAME" {
					return tc.nodeEnv
				}
				return ""
			}
			var stdout bytes.Buffer
			f, err := parse(tc.args, getenv, &stdout)
			assert.Empty(t, stdout.String(), "only --help writes on stdout")
			if tc.want != "" {
				var usage *cmdline.UsageError
				require.ErrorAs(t, err, &usage, "a bad command line is a usage error (exit 2)")
				assert.Contains(t, err.Error(), tc.want)
				return
			}
			require.NoError(t, err)
			assert.NotEmpty(t, f.nodeName)
		})
	}
}

func TestDefaults(t *testing.T) {
	f, err := parse(nil, func(k string) string {
		return map[string]string{"NODE_NAME": "node-a", "KUBECONFIG": "/etc/kube/a:/etc/kube/b"}[k]
	}, nil)
	require.NoError(t, err)
	assert.Equal(t, flags{
		Common: cmdline.Common{
			Kubeconfig:             "/etc/kube/a:/etc/kube/b",
			MetricsBindAddress:     agent.DefaultMetricsBindAddress,
			HealthProbeBindAddress: agent.DefaultHealthProbeBindAddress,
			KubeAPIQPS:             20,
			KubeAPIBurst:           40,
			LogLevel:               cmdline.LogInfo,
		},
		nodeName:           "node-a",
		leaseNamespace:     "d8-service-with-healthchecks",
		leaseRenewInterval: 10 * time.Second,
		probeConcurrency:   agent.DefaultProbeConcurrency,
		maxProbeTargets:    agent.DefaultMaxProbeTargets,
		maxEndpoints:       100,
	}, f)
	assert.Equal(t, "127.0.0.1:9781", f.MetricsBindAddress, "metrics stay on loopback")
}
