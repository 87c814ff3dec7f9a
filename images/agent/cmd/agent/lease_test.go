// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

// TestTheProgramRenewsItsNodeLease runs the agent program against a real API server and finds
// its node Lease in --lease-namespace, held and owned by the node.
func TestTheProgramRenewsItsNodeLease(t *testing.T) {
	env := controlplane.StartForTest(t, controlplane.Options{})
	ns := env.CreateNamespaceForTest(t, "agent-lease")
	// The agent writes no Lease for a node that does not exist (development/LIVENESS.md).
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "lease-node"}}
	require.NoError(t, env.Client.Create(t.Context(), node))
	kubeconfig, err := env.WriteKubeConfig(t.TempDir())
	require.NoError(t, err)

	cmd := exec.CommandContext(t.Context(), os.Args[0], "--node-name=lease-node", "--kubeconfig="+kubeconfig,
		"--lease-namespace="+ns, "--metrics-bind-address=127.0.0.1:0", "--health-probe-bind-address=127.0.0.1:0")
	cmd.Env = append(os.Environ(), "SWH_AGENT_RUN_MAIN=1")
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	process.StartForTest(t, "agent", cmd)

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var l coordinationv1.Lease
		require.NoError(c, env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: wellknown.AgentLeaseName("lease-node")}, &l))
		require.NotNil(c, l.Spec.HolderIdentity)
		assert.Equal(c, "lease-node", *l.Spec.HolderIdentity)
		assert.NotNil(c, l.Spec.RenewTime)
		assert.Equal(c, []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}, l.OwnerReferences)
	}, 60*time.Second, 100*time.Millisecond, "the agent creates its node Lease")
}
