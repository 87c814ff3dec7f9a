package main

import (
	"bytes"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

// TestTheProgramRenewsItsNodeLease runs the agent program against a real API server and finds
// its node Lease in --lease-namespace, held by the node.
func TestTheProgramRenewsItsNodeLease(t *testing.T) {
	env := controlplane.StartForTest(t, controlplane.Options{})
	ns := env.CreateNamespaceForTest(t, "agent-lease")
	kubeconfig, err := env.WriteKubeConfig(t.TempDir())
	require.NoError(t, err)

	cmd := exec.CommandContext(t.Context(), os.Args[0], "--node-name=lease-node", "--kubeconfig="+kubeconfig,
		"--lease-namespace="+ns, "--metrics-bind-address=127.0.0.1:0", "--health-probe-bind-address=127.0.0.1:0")
	cmd.Env = append(os.Environ(), "SWH_AGENT_RUN_MAIN=1")
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("agent output:\n%s", out.String())
		}
	})

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var l coordinationv1.Lease
		require.NoError(c, env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: slicemeta.AgentLeaseName("lease-node")}, &l))
		require.NotNil(c, l.Spec.HolderIdentity)
		assert.Equal(c, "lease-node", *l.Spec.HolderIdentity)
		assert.NotNil(c, l.Spec.RenewTime)
	}, 60*time.Second, 100*time.Millisecond, "the agent creates its node Lease")
}
