// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/lib/cmdline/cmdlinetest"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

// The test binary doubles as the program: with SWH_RUN_CONTROLLER=1 it runs main.
func TestMain(m *testing.M) {
	if os.Getenv("SWH_RUN_CONTROLLER") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func program(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
	cmd.Env = append(os.Environ(), "SWH_RUN_CONTROLLER=1", "KUBECONFIG=")
	return cmd
}

func TestBadFlagsExitWithOneLine(t *testing.T) {
	tests := map[string]struct {
		args     []string
		wantCode int
		want     string
	}{
		"an unknown flag is a usage error":       {args: []string{"--frobnicate"}, wantCode: 2, want: "controller: unknown flag: --frobnicate (see --help)\n"},
		"a bad duration is a usage error":        {args: []string{"--agent-lost-grace=later"}, wantCode: 2, want: `controller: invalid argument "later" for "--agent-lost-grace" flag: time: invalid duration "later" (see --help)` + "\n"},
		"metrics off the loopback are refused":   {args: []string{"--metrics-bind-address=0.0.0.0:8080"}, wantCode: 2, want: "must be a loopback address"},
		"an unknown log level is a usage error":  {args: []string{"--log-level=chatty"}, wantCode: 2, want: `controller: invalid argument "chatty" for "--log-level" flag: must be debug, info, warn or error (see --help)` + "\n"},
		"a missing flag value is a usage error":  {args: []string{"--leader-election-namespace"}, wantCode: 2, want: "controller: flag needs an argument: --leader-election-namespace (see --help)\n"},
		"a stray argument is a usage error":      {args: []string{"run"}, wantCode: 2, want: `controller: unexpected argument "run": controller takes flags only (see --help)` + "\n"},
		"no cluster to talk to is a failure":     {args: []string{"--metrics-bind-address=0", "--health-probe-bind-address=0"}, wantCode: 1, want: "controller: no --kubeconfig or $KUBECONFIG and not running in a cluster"},
		"a missing kubeconfig file is a failure": {args: []string{"--kubeconfig=/nonexistent/kubeconfig"}, wantCode: 1, want: "controller: loading kubeconfig /nonexistent/kubeconfig: "},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cmdlinetest.ExitsWithOneLine(t, program(t, tc.args...), "controller", tc.wantCode, tc.want)
		})
	}
}

func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	cmd := program(t, "--help")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "--help exits 0")
	assert.Empty(t, stderr.String())
	for _, flag := range []string{"--kubeconfig", "--metrics-bind-address", "--health-probe-bind-address", "--leader-elect",
		"--leader-election-namespace", "--agent-lease-namespace", "--agent-lost-grace", "--kube-api-qps", "--kube-api-burst",
		"--log-level", "--help"} {
		assert.Contains(t, stdout.String(), flag+" ")
	}
}

func TestVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	cmd := program(t, "--version", "--metrics-bind-address=0.0.0.0:1")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "--version exits 0 before the flags are checked")
	assert.Empty(t, stderr.String())
	assert.Equal(t, "controller dev (revision unknown, "+runtime.Version()+")\n", stdout.String(), "a build without -ldflags is dev")
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// TestTheProgramServesAndReconciles runs the program against a real API server: health and
// readiness answer, metrics are served on the loopback address, it wins the election and creates
// the child Service, and it stops cleanly on SIGTERM.
func TestTheProgramServesAndReconciles(t *testing.T) {
	env := controlplane.StartForTest(t, controlplane.Options{})
	ns := env.CreateNamespaceForTest(t, "main")
	kubeconfig, err := env.WriteKubeConfig(t.TempDir())
	require.NoError(t, err)
	metricsAddr, healthAddr := freePort(t), freePort(t)

	var stderr bytes.Buffer
	cmd := program(t, "--kubeconfig="+kubeconfig, "--metrics-bind-address="+metricsAddr,
		"--health-probe-bind-address="+healthAddr, "--leader-election-namespace="+ns, "--agent-lease-namespace="+ns)
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("controller output:\n%s", stderr.String())
		}
	})

	get := func(c *assert.CollectT, url string) string {
		resp, err := http.Get(url) //nolint:noctx // a test against loopback
		if !assert.NoError(c, err) {
			return ""
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		assert.Equal(c, http.StatusOK, resp.StatusCode, "%s: %s", url, body)
		return string(body)
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		get(c, "http://"+healthAddr+"/healthz")
		get(c, "http://"+healthAddr+"/readyz")
	}, 30*time.Second, 100*time.Millisecond, "health and readiness answer")

	swh := &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Ports: []v1alpha1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	require.NoError(t, env.Client.Create(t.Context(), swh))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var svc corev1.Service
		assert.NoError(c, env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "web"}, &svc))
	}, 30*time.Second, 100*time.Millisecond, "the program creates the child Service")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		body := get(c, "http://"+metricsAddr+"/metrics")
		assert.Contains(c, body, `swh_controller_reconciles_total{result="success"}`)
		assert.Contains(c, body, "swh_controller_reconcile_duration_seconds")
		assert.Contains(c, body, `swh_controller_build_info{goversion="`+runtime.Version()+`",revision="unknown",version="dev"} 1`)
	}, 30*time.Second, 100*time.Millisecond, "metrics are served")

	var lease coordinationv1.Lease
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "service-with-healthchecks-controller"}, &lease),
		"leader election holds a Lease in --leader-election-namespace")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		exited <- err
		require.NoError(t, err, "the program exits 0 on SIGTERM")
	case <-time.After(30 * time.Second):
		t.Fatal("the program did not stop on SIGTERM")
	}
	_, err = (&net.Dialer{}).DialContext(context.Background(), "tcp", healthAddr)
	assert.Error(t, err, "nothing listens once it stopped")
}
