// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package realnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

// Spec is what differs between the real nodes of a test.
type Spec struct {
	// Name of the Node; NodeIP its InternalIP, an address of the network namespace the test runs
	// in; PodCIDR its pods' range; Bridge its CNI bridge's name (at most 15 characters).
	Name, NodeIP, PodCIDR, Bridge string
}

// readyTimeout bounds the wait for a new node's Ready condition.
const readyTimeout = 2 * time.Minute

var images struct {
	once     sync.Once
	archives []string
	err      error
}

// EnabledEnv turns the real-node tests on: `make test-nodes` sets it to 1. They need root, the
// node and containerd tool groups (minutes to build on a fresh machine) and runc, so `make test`
// leaves them out.
const EnabledEnv = "SWH_REAL_NODES"

// SkipUnlessEnabled skips the test unless EnabledEnv is 1; call it before starting anything.
func SkipUnlessEnabled(t testing.TB) {
	t.Helper()
	if os.Getenv(EnabledEnv) != "1" {
		t.Skipf("real nodes run in `make test-nodes` (%s=1)", EnabledEnv)
	}
}

// StartForTest starts a real node against env's API server (started with the Node authorizer
// and NodeRestriction), with a node client certificate, and waits until its Node is Ready. The
// node is stopped and its state removed when the test ends; its logs are printed when the test
// failed. The tools are built into the tool cache on first use; the images once per process.
func StartForTest(t testing.TB, env *controlplane.Env, spec Spec) *Node {
	t.Helper()
	SkipUnlessEnabled(t)
	kubeletDir, err := ToolDir("node")
	if err != nil {
		t.Fatal(err)
	}
	toolsDir, err := ToolDir("containerd")
	if err != nil {
		t.Fatal(err)
	}
	images.once.Do(func() {
		dir, err := os.MkdirTemp("", "swh-images-")
		if err != nil {
			images.err = err
			return
		}
		images.archives, images.err = BuildImages(dir)
	})
	if images.err != nil {
		t.Fatal(images.err)
	}
	kubeconfig, err := env.KubeConfigFor("system:node:"+spec.Name, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "swh-node-"+spec.Name+"-")
	if err != nil {
		t.Fatal(err)
	}
	n, err := Start(t.Context(), Options{
		Name: spec.Name, NodeIP: spec.NodeIP, PodCIDR: spec.PodCIDR, Bridge: spec.Bridge, Dir: dir,
		ToolsDir: toolsDir, Kubelet: filepath.Join(kubeletDir, "kubelet"), Runc: os.Getenv("SWH_REALNODE_RUNC"),
		PauseImage: PauseImage, Images: images.archives, KubeConfig: kubeconfig,
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("real node %s:\n%s", spec.Name, n.Logs(16<<10))
		}
		if err := n.Stop(); err != nil {
			t.Errorf("stopping real node %s: %v", spec.Name, err)
		}
		_ = os.RemoveAll(dir)
	})
	if err != nil {
		t.Fatalf("starting real node %s: %v", spec.Name, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), readyTimeout)
	defer cancel()
	if err := WaitReady(ctx, env.Client, spec.Name); err != nil {
		t.Fatal(err)
	}
	return n
}

// WaitReady waits until the Node's Ready condition is True.
func WaitReady(ctx context.Context, c client.Client, name string) error {
	for {
		var node corev1.Node
		err := c.Get(ctx, client.ObjectKey{Name: name}, &node)
		if err == nil && nodeReady(&node) {
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("node %s did not become Ready: %w (last error: %w)", name, ctx.Err(), err)
			}
			return fmt.Errorf("node %s did not become Ready: %w", name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
