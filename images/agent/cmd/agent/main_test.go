package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
)

// TestMain runs the program itself when asked, so tests can check its exit code and output.
func TestMain(m *testing.M) {
	if os.Getenv("SWH_AGENT_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestAMissingNodeNameStopsTheProgramWithOneLine(t *testing.T) {
	cmd := exec.CommandContext(t.Context(), os.Args[0], "--kubeconfig=/nonexistent")
	cmd.Env = append(os.Environ(), "SWH_AGENT_RUN_MAIN=1", "NODE_NAME=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "the program fails: %v", err)
	assert.Equal(t, 1, exit.ExitCode())
	assert.Equal(t, "agent: --node-name (or $NODE_NAME) is required\n", stderr.String())
	assert.Equal(t, 1, strings.Count(stderr.String(), "\n"))
}

func TestParse(t *testing.T) {
	tests := map[string]struct {
		env  string
		args []string
		want string // error text; empty when the flags are valid
	}{
		"the node name comes from the flag":        {args: []string{"--node-name=node-a"}},
		"the node name defaults to NODE_NAME":      {env: "node-a"},
		"a missing node name is an error":          {want: "--node-name (or $NODE_NAME) is required"},
		"an unknown flag is an error":              {env: "node-a", args: []string{"--bogus"}, want: "flag provided but not defined: -bogus"},
		"a zero probe concurrency is an error":     {env: "node-a", args: []string{"--probe-concurrency=0"}, want: "--probe-concurrency must be at least 1, not 0"},
		"an unknown log level is an error":         {env: "node-a", args: []string{"--log-level=trace"}, want: `--log-level must be debug, info or error, not "trace"`},
		"every flag the chart renders is accepted": {args: []string{"--node-name=n", "--metrics-bind-address=127.0.0.1:9781", "--health-probe-bind-address=127.0.0.1:9782", "--lease-namespace=d8-service-with-healthchecks", "--probe-concurrency=64", "--kube-api-qps=20", "--kube-api-burst=40", "--log-level=debug"}},
		"a stray argument is an error":             {env: "node-a", args: []string{"extra"}, want: "unexpected arguments: [extra]"},
		"a non-positive API rate is an error":      {env: "node-a", args: []string{"--kube-api-qps=0"}, want: "--kube-api-qps must be positive, not 0"},
		"a burst below one is an error":            {env: "node-a", args: []string{"--kube-api-burst=0"}, want: "--kube-api-burst must be at least 1, not 0"},
		"a short lease renewal is accepted":        {env: "node-a", args: []string{"--lease-renew-interval=500ms"}},
		"a zero lease renewal is an error":         {env: "node-a", args: []string{"--lease-renew-interval=0s"}, want: "--lease-renew-interval must be positive, not 0s"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv("NODE_NAME", tc.env)
			f, err := parse(tc.args)
			if tc.want != "" {
				require.EqualError(t, err, tc.want)
				return
			}
			require.NoError(t, err)
			assert.NotEmpty(t, f.nodeName)
		})
	}
}

func TestDefaults(t *testing.T) {
	t.Setenv("NODE_NAME", "node-a")
	f, err := parse(nil)
	require.NoError(t, err)
	assert.Equal(t, flags{
		nodeName:               "node-a",
		kubeconfig:             f.kubeconfig, // from $KUBECONFIG of the environment
		metricsBindAddress:     agent.DefaultMetricsBindAddress,
		healthProbeBindAddress: agent.DefaultHealthProbeBindAddress,
		leaseNamespace:         "d8-service-with-healthchecks",
		leaseRenewInterval:     10 * time.Second,
		probeConcurrency:       agent.DefaultProbeConcurrency,
		kubeAPIQPS:             20,
		kubeAPIBurst:           40,
		logLevel:               "info",
	}, f)
	assert.Equal(t, "127.0.0.1:9781", f.metricsBindAddress, "metrics stay on loopback")
}
