// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/lib/cmdline"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestDefaults(t *testing.T) {
	c, err := Parse(nil, env(nil), nil)
	require.NoError(t, err)
	assert.Equal(t, Config{
		Common: cmdline.Common{
			MetricsBindAddress:     "127.0.0.1:8080",
			HealthProbeBindAddress: ":8081",
			KubeAPIQPS:             50,
			KubeAPIBurst:           100,
			LogLevel:               cmdline.LogInfo,
		},
		LeaderElect:             true,
		LeaderElectionNamespace: "d8-service-with-healthchecks",
		AgentLeaseNamespace:     "d8-service-with-healthchecks",
		AgentLostGrace:          40 * time.Second,
		MaxConcurrentReconciles: 1,
	}, c)
}

func TestParse(t *testing.T) {
	tests := map[string]struct {
		args    []string
		env     map[string]string
		check   func(*testing.T, Config)
		wantErr string
	}{
		"KUBECONFIG is the default kubeconfig": {
			env:   map[string]string{"KUBECONFIG": "/etc/kube/config"},
			check: func(t *testing.T, c Config) { assert.Equal(t, "/etc/kube/config", c.Kubeconfig) },
		},
		"the flag wins over KUBECONFIG": {
			args:  []string{"--kubeconfig=/tmp/k"},
			env:   map[string]string{"KUBECONFIG": "/etc/kube/config"},
			check: func(t *testing.T, c Config) { assert.Equal(t, "/tmp/k", c.Kubeconfig) },
		},
		"every flag is taken": {
			args: []string{
				"--metrics-bind-address=[::1]:9000", "--health-probe-bind-address=0.0.0.0:9001",
				"--leader-elect=false", "--leader-election-namespace=le", "--agent-lease-namespace=al",
				"--agent-lost-grace=1m30s", "--kube-api-qps=20.5", "--kube-api-burst=7", "--log-level=debug",
				"--max-concurrent-reconciles=4",
			},
			check: func(t *testing.T, c Config) {
				assert.Equal(t, Config{
					Common: cmdline.Common{
						MetricsBindAddress: "[::1]:9000", HealthProbeBindAddress: "0.0.0.0:9001",
						KubeAPIQPS: 20.5, KubeAPIBurst: 7, LogLevel: cmdline.LogDebug,
					},
					LeaderElectionNamespace: "le", AgentLeaseNamespace: "al", AgentLostGrace: 90 * time.Second,
					MaxConcurrentReconciles: 4,
				}, c)
			},
		},
		"the minimum grace is accepted": {
			args:  []string{"--agent-lost-grace=4s"},
			check: func(t *testing.T, c Config) { assert.Equal(t, 4*time.Second, c.AgentLostGrace) },
		},
		"metrics can be turned off": {
			args:  []string{"--metrics-bind-address=0"},
			check: func(t *testing.T, c Config) { assert.Equal(t, "0", c.MetricsBindAddress) },
		},
		"metrics on localhost are fine": {
			args:  []string{"--metrics-bind-address=localhost:8080"},
			check: func(t *testing.T, c Config) { assert.Equal(t, "localhost:8080", c.MetricsBindAddress) },
		},
		"leader election off needs no namespace": {
			args:  []string{"--leader-elect=false", "--leader-election-namespace="},
			check: func(t *testing.T, c Config) { assert.False(t, c.LeaderElect) },
		},
		"an unknown flag":                          {args: []string{"--nope"}, wantErr: "unknown flag: --nope"},
		"a bad duration":                           {args: []string{"--agent-lost-grace=soon"}, wantErr: `invalid argument "soon" for "--agent-lost-grace"`},
		"a zero grace":                             {args: []string{"--agent-lost-grace=0s"}, wantErr: "--agent-lost-grace 0s: must be at least 4s"},
		"a negative grace":                         {args: []string{"--agent-lost-grace=-1s"}, wantErr: "must be at least 4s"},
		"a grace just under the minimum":           {args: []string{"--agent-lost-grace=3999ms"}, wantErr: "--agent-lost-grace 3.999s: must be at least 4s"},
		"a zero QPS":                               {args: []string{"--kube-api-qps=0"}, wantErr: "--kube-api-qps 0: must be positive"},
		"a zero burst":                             {args: []string{"--kube-api-burst=0"}, wantErr: "--kube-api-burst 0: must be at least 1"},
		"metrics on every address":                 {args: []string{"--metrics-bind-address=:8080"}, wantErr: "must be a loopback address"},
		"metrics on a pod address":                 {args: []string{"--metrics-bind-address=10.0.0.1:8080"}, wantErr: "must be a loopback address"},
		"metrics without a port":                   {args: []string{"--metrics-bind-address=127.0.0.1"}, wantErr: "--metrics-bind-address"},
		"health on a port that is no number":       {args: []string{"--health-probe-bind-address=:http"}, wantErr: "--health-probe-bind-address"},
		"an unknown log level":                     {args: []string{"--log-level=loud"}, wantErr: `"loud" for "--log-level" flag: must be debug, info, warn or error`},
		"a panic log level is refused":             {args: []string{"--log-level=panic"}, wantErr: "--log-level"},
		"an empty leader election namespace":       {args: []string{"--leader-election-namespace="}, wantErr: "--leader-election-namespace"},
		"an empty agent lease namespace":           {args: []string{"--agent-lease-namespace="}, wantErr: "--agent-lease-namespace"},
		"a stray argument":                         {args: []string{"run"}, wantErr: `unexpected argument "run"`},
		"a bool flag with a value that is no bool": {args: []string{"--leader-elect=maybe"}, wantErr: "--leader-elect"},
		"no reconcile worker":                      {args: []string{"--max-concurrent-reconciles=0"}, wantErr: "--max-concurrent-reconciles 0: must be between 1 and 64"},
		"too many reconcile workers":               {args: []string{"--max-concurrent-reconciles=65"}, wantErr: "--max-concurrent-reconciles 65: must be between 1 and 64"},
		"reconcile workers that are no number":     {args: []string{"--max-concurrent-reconciles=many"}, wantErr: "--max-concurrent-reconciles"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c, err := Parse(tc.args, env(tc.env), nil)
			if tc.wantErr != "" {
				var usage *cmdline.UsageError
				require.ErrorAs(t, err, &usage, "a bad command line is a usage error (exit 2)")
				assert.Contains(t, err.Error(), tc.wantErr)
				assert.NotContains(t, err.Error(), "\n", "the error is one line")
				return
			}
			require.NoError(t, err)
			tc.check(t, c)
		})
	}
}

func TestHelpExplainsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	_, err := Parse([]string{"--help"}, env(nil), &out)
	require.ErrorIs(t, err, ErrHelp)
	help := out.String()
	frozen := []string{ // DESIGN §12
		"--kubeconfig", "--metrics-bind-address", "--health-probe-bind-address", "--leader-elect",
		"--leader-election-namespace", "--agent-lease-namespace", "--agent-lost-grace", "--log-level",
	}
	listed := map[string]string{}
	for l := range strings.SplitSeq(help, "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], "--") {
			listed[f[0]] = l
		}
	}
	for _, flag := range frozen {
		assert.Contains(t, listed, flag, "--help lists the frozen flag %s", flag)
	}
	// Every flag the program has is explained, with its default where it has one.
	n := 0
	for name, line := range listed {
		n++
		assert.Greater(t, len(line), len(name)+30, "--help explains %s: %q", name, line)
	}
	assert.Equal(t, 13, n, "the shared flags, the five of the controller, --help and --version")
	assert.Contains(t, listed, "--version", "--help lists --version")
	assert.Contains(t, listed["--metrics-bind-address"], `(default "127.0.0.1:8080")`)
	assert.Contains(t, listed["--health-probe-bind-address"], `(default ":8081")`)
	assert.Contains(t, listed["--leader-elect"], "(default true)")
	assert.Contains(t, listed["--leader-election-namespace"], `(default "d8-service-with-healthchecks")`)
	assert.Contains(t, listed["--agent-lease-namespace"], `(default "d8-service-with-healthchecks")`)
	assert.Contains(t, listed["--agent-lost-grace"], "(default 40s)")
	assert.Contains(t, listed["--max-concurrent-reconciles"], "(default 1)")
	assert.Contains(t, listed["--kube-api-qps"], "(default 50)")
	assert.Contains(t, listed["--kube-api-burst"], "(default 100)")
	assert.Contains(t, listed["--log-level"], "(default info)")
	assert.Contains(t, listed["--kubeconfig"], "(default $KUBECONFIG)")
}
