package config

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zapcore"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestDefaults(t *testing.T) {
	c, err := Parse(nil, env(nil), nil)
	require.NoError(t, err)
	assert.Equal(t, Config{
		MetricsBindAddress:      "127.0.0.1:8080",
		HealthProbeBindAddress:  ":8081",
		LeaderElect:             true,
		LeaderElectionNamespace: "d8-service-with-healthchecks",
		AgentLeaseNamespace:     "d8-service-with-healthchecks",
		AgentLostGrace:          40 * time.Second,
		KubeAPIQPS:              50,
		KubeAPIBurst:            100,
		LogLevel:                zapcore.InfoLevel,
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
			},
			check: func(t *testing.T, c Config) {
				assert.Equal(t, Config{
					MetricsBindAddress: "[::1]:9000", HealthProbeBindAddress: "0.0.0.0:9001",
					LeaderElectionNamespace: "le", AgentLeaseNamespace: "al",
					AgentLostGrace: 90 * time.Second, KubeAPIQPS: 20.5, KubeAPIBurst: 7, LogLevel: zapcore.DebugLevel,
				}, c)
			},
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
		"a zero grace":                             {args: []string{"--agent-lost-grace=0s"}, wantErr: "--agent-lost-grace 0s: must be positive"},
		"a negative grace":                         {args: []string{"--agent-lost-grace=-1s"}, wantErr: "must be positive"},
		"a zero QPS":                               {args: []string{"--kube-api-qps=0"}, wantErr: "--kube-api-qps 0: must be positive"},
		"a zero burst":                             {args: []string{"--kube-api-burst=0"}, wantErr: "--kube-api-burst 0: must be at least 1"},
		"metrics on every address":                 {args: []string{"--metrics-bind-address=:8080"}, wantErr: "must be a loopback address"},
		"metrics on a pod address":                 {args: []string{"--metrics-bind-address=10.0.0.1:8080"}, wantErr: "must be a loopback address"},
		"metrics without a port":                   {args: []string{"--metrics-bind-address=127.0.0.1"}, wantErr: "--metrics-bind-address"},
		"health on a port that is no number":       {args: []string{"--health-probe-bind-address=:http"}, wantErr: "--health-probe-bind-address"},
		"an unknown log level":                     {args: []string{"--log-level=loud"}, wantErr: `--log-level "loud": must be debug, info, warn or error`},
		"a panic log level is refused":             {args: []string{"--log-level=panic"}, wantErr: "--log-level"},
		"an empty leader election namespace":       {args: []string{"--leader-election-namespace="}, wantErr: "--leader-election-namespace"},
		"an empty agent lease namespace":           {args: []string{"--agent-lease-namespace="}, wantErr: "--agent-lease-namespace"},
		"a stray argument":                         {args: []string{"run"}, wantErr: `unexpected argument "run"`},
		"a bool flag with a value that is no bool": {args: []string{"--leader-elect=maybe"}, wantErr: "--leader-elect"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c, err := Parse(tc.args, env(tc.env), nil)
			if tc.wantErr != "" {
				require.Error(t, err)
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
	for _, flag := range []string{
		"--kubeconfig", "--metrics-bind-address", "--health-probe-bind-address", "--leader-elect",
		"--leader-election-namespace", "--agent-lease-namespace", "--agent-lost-grace", "--log-level",
	} {
		i := strings.Index(out.String(), flag+" ")
		if assert.GreaterOrEqual(t, i, 0, "--help lists %s", flag) {
			line := out.String()[i:]
			line = line[:strings.IndexByte(line, '\n')]
			assert.Greater(t, len(line), len(flag)+30, "--help explains %s: %q", flag, line)
		}
	}
	assert.Contains(t, out.String(), `(default "127.0.0.1:8080")`)
	assert.Contains(t, out.String(), "(default 40s)")
}
