// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cmdline

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/lib/version"
)

func TestReport(t *testing.T) {
	tests := map[string]struct {
		err      error
		wantCode int
		wantErr  string
	}{
		"a clean stop prints nothing and exits 0":      {err: nil, wantCode: ExitOK},
		"help exits 0 and prints nothing on stderr":    {err: ErrHelp, wantCode: ExitOK},
		"version exits 0 and prints nothing on stderr": {err: ErrVersion, wantCode: ExitOK},
		"a usage error exits 2 and points to --help": {
			err: Usagef("--x %q: must be positive", "0"), wantCode: ExitUsage, wantErr: "prog: --x \"0\": must be positive (see --help)\n",
		},
		"a wrapped usage error is still a usage error": {
			err: fmt.Errorf("checking: %w", Usagef("--x: bad")), wantCode: ExitUsage, wantErr: "prog: checking: --x: bad (see --help)\n",
		},
		"a failure after start-up exits 1": {
			err: errors.New("running the manager: boom"), wantCode: ExitFailure, wantErr: "prog: running the manager: boom\n",
		},
		"a failure over several lines is reported on one": {
			err: errors.New("loading kubeconfig:\n  line one\n\tline two"), wantCode: ExitFailure, wantErr: "prog: loading kubeconfig: line one line two\n",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var stderr bytes.Buffer
			assert.Equal(t, tc.wantCode, Report(&stderr, "prog", tc.err))
			assert.Equal(t, tc.wantErr, stderr.String())
		})
	}
}

func TestUsageKeepsNilAndDoesNotWrapTwice(t *testing.T) {
	require.NoError(t, Usage(nil))
	inner := Usagef("--x: bad")
	assert.Same(t, inner, Usage(inner))
	base := errors.New("base")
	assert.ErrorIs(t, Usage(base), base, "the reason stays reachable")
}

// testProgram is a program with the shared flags and one of its own, as the agent and the
// controller build theirs.
func testProgram(env map[string]string) (*Program, *Common, *time.Duration) {
	p := New("prog", "Does things.")
	c := &Common{}
	c.AddFlags(p.Flags, func(k string) string { return env[k] }, Defaults{
		MetricsBindAddress: "127.0.0.1:8080", HealthProbeBindAddress: ":8081", KubeAPIQPS: 20, KubeAPIBurst: 40,
	})
	grace := p.Flags.Duration("grace", 40*time.Second, "A duration of its own.")
	return p, c, grace
}

func TestParse(t *testing.T) {
	tests := map[string]struct {
		args    []string
		env     map[string]string
		want    Common
		wantErr string // a usage error containing this; empty when the line is good
	}{
		"the defaults are the program's": {
			want: Common{MetricsBindAddress: "127.0.0.1:8080", HealthProbeBindAddress: ":8081", KubeAPIQPS: 20, KubeAPIBurst: 40, LogLevel: LogInfo},
		},
		"KUBECONFIG is the default kubeconfig": {
			env:  map[string]string{"KUBECONFIG": "/etc/kube/a:/etc/kube/b"},
			want: Common{Kubeconfig: "/etc/kube/a:/etc/kube/b", MetricsBindAddress: "127.0.0.1:8080", HealthProbeBindAddress: ":8081", KubeAPIQPS: 20, KubeAPIBurst: 40, LogLevel: LogInfo},
		},
		"every shared flag is taken, with = or as the next argument": {
			args: []string{"--kubeconfig", "/tmp/k", "--metrics-bind-address=[::1]:9000", "--health-probe-bind-address", "0.0.0.0:9001",
				"--kube-api-qps=20.5", "--kube-api-burst=7", "--log-level", "debug"},
			env:  map[string]string{"KUBECONFIG": "/etc/kube/config"},
			want: Common{Kubeconfig: "/tmp/k", MetricsBindAddress: "[::1]:9000", HealthProbeBindAddress: "0.0.0.0:9001", KubeAPIQPS: 20.5, KubeAPIBurst: 7, LogLevel: LogDebug},
		},
		"warn and error are log levels": {
			args: []string{"--log-level=warn", "--log-level=error"},
			want: Common{MetricsBindAddress: "127.0.0.1:8080", HealthProbeBindAddress: ":8081", KubeAPIQPS: 20, KubeAPIBurst: 40, LogLevel: LogError},
		},
		"an unknown flag is a usage error":       {args: []string{"--frobnicate"}, wantErr: "unknown flag: --frobnicate"},
		"a single-dash long flag is refused":     {args: []string{"-kubeconfig=/tmp/k"}, wantErr: "unknown shorthand flag"},
		"a flag without its value":               {args: []string{"--kubeconfig"}, wantErr: "flag needs an argument: --kubeconfig"},
		"a bad duration names the flag":          {args: []string{"--grace=soon"}, wantErr: `invalid argument "soon" for "--grace" flag`},
		"a bad number names the flag":            {args: []string{"--kube-api-burst=many"}, wantErr: `invalid argument "many" for "--kube-api-burst" flag`},
		"an unknown log level names the values":  {args: []string{"--log-level=trace"}, wantErr: `invalid argument "trace" for "--log-level" flag: must be debug, info, warn or error`},
		"a panic log level is not one of ours":   {args: []string{"--log-level=panic"}, wantErr: "must be debug, info, warn or error"},
		"a stray argument is a usage error":      {args: []string{"run"}, wantErr: `unexpected argument "run": prog takes flags only`},
		"an argument after -- is still a stray":  {args: []string{"--", "--log-level=debug"}, wantErr: `unexpected argument "--log-level=debug"`},
		"help as a value is not asking for help": {args: []string{"--kubeconfig", "--help"}, want: Common{Kubeconfig: "--help", MetricsBindAddress: "127.0.0.1:8080", HealthProbeBindAddress: ":8081", KubeAPIQPS: 20, KubeAPIBurst: 40, LogLevel: LogInfo}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, c, _ := testProgram(tc.env)
			var stdout bytes.Buffer
			err := p.Parse(tc.args, &stdout)
			assert.Empty(t, stdout.String(), "only --help writes on stdout")
			if tc.wantErr != "" {
				var usage *UsageError
				require.ErrorAs(t, err, &usage)
				assert.Contains(t, err.Error(), tc.wantErr)
				assert.NotContains(t, err.Error(), "\n")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, *c)
		})
	}
}

func TestVersionPrintsTheLineAndStops(t *testing.T) {
	for name, tc := range map[string]struct {
		args    []string
		wantErr error
		wantOut string
	}{
		"--version prints the version line":                  {args: []string{"--version"}, wantErr: ErrVersion, wantOut: version.Line("prog")},
		"--version stops before the flags' checks":           {args: []string{"--version", "--log-level=debug"}, wantErr: ErrVersion, wantOut: version.Line("prog")},
		"--help wins over --version":                         {args: []string{"--version", "--help"}, wantErr: ErrHelp},
		"--version=false runs the program":                   {args: []string{"--version=false"}},
		"a bad flag beside --version is still a usage error": {args: []string{"--version", "--frobnicate"}},
	} {
		t.Run(name, func(t *testing.T) {
			p, _, _ := testProgram(nil)
			var stdout bytes.Buffer
			err := p.Parse(tc.args, &stdout)
			switch {
			case tc.wantErr != nil:
				require.ErrorIs(t, err, tc.wantErr)
			case strings.Contains(name, "usage"):
				var usage *UsageError
				require.ErrorAs(t, err, &usage)
			default:
				require.NoError(t, err)
			}
			if tc.wantOut != "" {
				assert.Equal(t, tc.wantOut, stdout.String())
				assert.Contains(t, stdout.String(), "prog "+version.Version+" (revision "+version.Revision+", go")
			}
			if tc.wantErr == nil {
				assert.Empty(t, stdout.String())
			}
		})
	}
}

func TestHelpListsEveryFlagWithItsDefault(t *testing.T) {
	for _, arg := range []string{"--help", "-h", "--help=true"} {
		t.Run(arg, func(t *testing.T) {
			p, _, _ := testProgram(nil)
			var stdout bytes.Buffer
			require.ErrorIs(t, p.Parse([]string{"--log-level=debug", arg}, &stdout), ErrHelp)
			help := stdout.String()
			assert.True(t, strings.HasPrefix(help, "Usage: prog [flags]\n\nDoes things.\n\nFlags:\n"), help)
			n := 0
			p.Flags.VisitAll(func(f *pflag.Flag) {
				n++
				line := helpLine(t, help, f.Name)
				_, usage := pflag.UnquoteUsage(f)
				assert.Contains(t, line, usage, "--%s is explained", f.Name)
				if f.DefValue != "" && f.DefValue != "false" {
					assert.Contains(t, line, "(default "+quoteDefault(f)+")", "--%s shows its default", f.Name)
				}
			})
			assert.Equal(t, 9, n, "the six shared flags, the program's own, --help and --version")
		})
	}
}

// helpLine is the line of --help that documents the flag.
func helpLine(t *testing.T, help, flag string) string {
	t.Helper()
	for l := range strings.SplitSeq(help, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "--"+flag+" ") {
			return l
		}
	}
	t.Errorf("--help does not list --%s:\n%s", flag, help)
	return ""
}

func quoteDefault(f *pflag.Flag) string {
	if f.Value.Type() == "string" {
		return fmt.Sprintf("%q", f.DefValue)
	}
	return f.DefValue
}

func TestCheck(t *testing.T) {
	good := Common{MetricsBindAddress: "127.0.0.1:8080", HealthProbeBindAddress: ":8081", KubeAPIQPS: 20, KubeAPIBurst: 40, LogLevel: LogInfo}
	tests := map[string]struct {
		change  func(*Common)
		wantErr string // empty when the values are good
	}{
		"the defaults are good":                       {change: func(*Common) {}},
		"metrics can be turned off":                   {change: func(c *Common) { c.MetricsBindAddress = "0" }},
		"metrics on localhost are fine":               {change: func(c *Common) { c.MetricsBindAddress = "localhost:8080" }},
		"metrics on the IPv6 loopback are fine":       {change: func(c *Common) { c.MetricsBindAddress = "[::1]:8080" }},
		"metrics on any port of the loopback":         {change: func(c *Common) { c.MetricsBindAddress = "127.0.0.1:0" }},
		"health can be turned off":                    {change: func(c *Common) { c.HealthProbeBindAddress = "0" }},
		"health on the pod network is fine":           {change: func(c *Common) { c.HealthProbeBindAddress = "0.0.0.0:8081" }},
		"metrics on every address are refused":        {change: func(c *Common) { c.MetricsBindAddress = ":8080" }, wantErr: `--metrics-bind-address ":8080": must be a loopback address`},
		"metrics on a pod address are refused":        {change: func(c *Common) { c.MetricsBindAddress = "10.0.0.1:8080" }, wantErr: "must be a loopback address"},
		"metrics on a host name are refused":          {change: func(c *Common) { c.MetricsBindAddress = "metrics.local:8080" }, wantErr: "must be a loopback address"},
		"metrics without a port are refused":          {change: func(c *Common) { c.MetricsBindAddress = "127.0.0.1" }, wantErr: `--metrics-bind-address "127.0.0.1": address 127.0.0.1: missing port`},
		"metrics on a port out of range are refused":  {change: func(c *Common) { c.MetricsBindAddress = "127.0.0.1:70000" }, wantErr: `port "70000" is not a number from 0 to 65535`},
		"health on a named port is refused":           {change: func(c *Common) { c.HealthProbeBindAddress = ":http" }, wantErr: `--health-probe-bind-address ":http": port "http"`},
		"health without a port is refused":            {change: func(c *Common) { c.HealthProbeBindAddress = "localhost" }, wantErr: "--health-probe-bind-address"},
		"a zero QPS is refused":                       {change: func(c *Common) { c.KubeAPIQPS = 0 }, wantErr: "--kube-api-qps 0: must be positive"},
		"a negative QPS is refused":                   {change: func(c *Common) { c.KubeAPIQPS = -1 }, wantErr: "--kube-api-qps -1: must be positive"},
		"a zero burst is refused":                     {change: func(c *Common) { c.KubeAPIBurst = 0 }, wantErr: "--kube-api-burst 0: must be at least 1"},
		"a fractional QPS below one is still allowed": {change: func(c *Common) { c.KubeAPIQPS = 0.5 }},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := good
			tc.change(&c)
			err := c.Check()
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			var usage *UsageError
			require.ErrorAs(t, err, &usage, "a bad value is a usage error")
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}
