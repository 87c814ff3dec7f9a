// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package realnode_test runs the product's edge cases on real nodes: a kubelet and containerd
// per node (testkit/realnode), pods that are real containers. See development/E2E.md.
package realnode_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/realnode"
)

func TestMain(m *testing.M) { cluster.RunIsolated(m) }

const waitFor = 40 * time.Second

func TestRealNodeRegistersReadyAndRunsAPod(t *testing.T) {
	c := cluster.Start(t, cluster.Options{
		KubeProxy: true,
		ControlPlane: controlplane.Options{APIServerFlags: map[string]string{
			"authorization-mode":       "Node,RBAC",
			"enable-admission-plugins": "NodeRestriction",
		}},
	})
	ctx := t.Context()
	kubeletDir, err := realnode.ToolDir("node")
	require.NoError(t, err)
	toolsDir, err := realnode.ToolDir("containerd")
	require.NoError(t, err)
	images, err := realnode.BuildImages(t.TempDir())
	require.NoError(t, err)
	kubeconfig, err := c.Env.KubeConfigFor("system:node:real-a", "system:nodes")
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "swh-node-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	n, err := realnode.Start(ctx, realnode.Options{
		Name: "real-a", NodeIP: "198.19.0.1", PodCIDR: "198.18.200.0/24", Bridge: "swhcni0",
		Dir: dir, ToolsDir: toolsDir, Kubelet: kubeletDir + "/kubelet",
		PauseImage: realnode.PauseImage, Images: images, KubeConfig: kubeconfig,
		Runc: os.Getenv("SWH_REALNODE_RUNC"),
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(n.Logs(8000))
		}
		require.NoError(t, n.Stop())
	})
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		var node corev1.Node
		if err := c.Env.Client.Get(ctx, client.ObjectKey{Name: "real-a"}, &node); err != nil {
			return false
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue
			}
		}
		return false
	}, waitFor, 200*time.Millisecond, "node real-a did not become Ready\n%s", n.Logs(8000))

	ns := c.Env.CreateNamespaceForTest(t, "realnode")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: corev1.PodSpec{
			NodeName: "real-a",
			Containers: []corev1.Container{{
				Name: "server", Image: realnode.ServerImage, ImagePullPolicy: corev1.PullNever,
				Args: []string{"-listen", ":8080"},
				Env: []corev1.EnvVar{
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
					{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
				},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
			}},
			AutomountServiceAccountToken: new(false),
		},
	}
	require.NoError(t, c.Env.Client.Create(ctx, pod))
	var ip string
	require.Eventually(t, func() bool {
		var p corev1.Pod
		if err := c.Env.Client.Get(ctx, client.ObjectKeyFromObject(pod), &p); err != nil {
			return false
		}
		ip = p.Status.PodIP
		return p.Status.Phase == corev1.PodRunning && ip != ""
	}, waitFor, 200*time.Millisecond, "pod did not run\n%s", n.Logs(8000))
	resp, err := httpGet(ctx, fmt.Sprintf("http://%s:8080/", ip))
	require.NoError(t, err)
	require.Equal(t, ns+"/web", resp.Header.Get("X-Pod"))
}

func httpGet(ctx context.Context, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Do(req)
	if err != nil {
		return nil, err
	}
	_ = resp.Body.Close()
	return resp, nil
}
