// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// get sends one HTTP request to addr:port and returns the status and the X-Pod header.
func get(t *testing.T, addr string, port int) (int, string) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get("http://" + addr + ":" + strconv.Itoa(port) + "/")
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Pod")
}

func TestBulkPodsShareOneNamespaceWithAnAddressAndObjectEach(t *testing.T) {
	c := cluster.Start(t, cluster.Options{})
	ns := c.Env.CreateNamespaceForTest(t, "bulk")
	const count, port = 200, 8080

	// A bulk made and removed inside this subtest, so its removal can be checked.
	var netns, link string
	t.Run("pods", func(t *testing.T) {
		b := c.AddBulkPods(t, cluster.BulkSpec{Namespace: ns, Count: count, Port: port, Labels: map[string]string{"app": "bulk"}})
		netns, link = b.Netns, b.HostLink
		require.Equal(t, count, b.Len())

		var pods corev1.PodList
		require.NoError(t, c.Env.Client.List(t.Context(), &pods, client.InNamespace(ns), client.MatchingLabels{"app": "bulk"}))
		require.Len(t, pods.Items, count)
		byName := map[string]corev1.Pod{}
		for _, p := range pods.Items {
			byName[p.Name] = p
		}
		seen := map[string]bool{}
		for i, p := range b.Pods {
			obj, ok := byName[fmt.Sprintf("bulk-%d", i)]
			require.True(t, ok, "pod bulk-%d", i)
			assert.Equal(t, p.IP.String(), obj.Status.PodIP, "pod %d", i)
			assert.Equal(t, corev1.PodRunning, obj.Status.Phase)
			assert.Equal(t, c.Nodes[0].Name, obj.Spec.NodeName)
			assert.False(t, seen[p.IP.String()], "address %s given twice", p.IP)
			seen[p.IP.String()] = true
			assert.Equal(t, i, b.Index(p.IP))
		}

		// Every address answers, naming its own pod; flipping one pod changes only that one.
		for _, i := range []int{0, 1, count / 2, count - 1} {
			status, pod := get(t, b.Pods[i].IP.String(), port)
			assert.Equal(t, http.StatusOK, status, "pod %d", i)
			assert.Equal(t, b.Pods[i].Key(), pod)
		}
		b.SetHealthy(7, false)
		assert.False(t, b.Healthy(7))
		status, pod := get(t, b.Pods[7].IP.String(), port)
		assert.Equal(t, http.StatusServiceUnavailable, status)
		assert.Equal(t, b.Pods[7].Key(), pod)
		status, _ = get(t, b.Pods[8].IP.String(), port)
		assert.Equal(t, http.StatusOK, status, "a neighbour of the unhealthy pod")
		b.SetHealthy(7, true)
		status, _ = get(t, b.Pods[7].IP.String(), port)
		assert.Equal(t, http.StatusOK, status)
		assert.Equal(t, int64(2), b.Hits(7))
		assert.Equal(t, int64(0), b.Hits(9))

		// The object side works like any pod's.
		b.Pods[3].SetReady(t, false)
		obj, err := b.Pods[3].Object(t.Context())
		require.NoError(t, err)
		for _, cond := range obj.Status.Conditions {
			if cond.Type == corev1.PodReady {
				assert.Equal(t, corev1.ConditionFalse, cond.Status)
			}
		}
	})

	// Gone with the subtest: objects, namespace, link.
	var pods corev1.PodList
	require.NoError(t, c.Env.Client.List(t.Context(), &pods, client.InNamespace(ns)))
	assert.Empty(t, pods.Items)
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.NotContains(t, string(out), netns)
	require.NotEmpty(t, netns)
	out, err = exec.Command("ip", "-o", "link", "show").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.NotContains(t, string(out), link+"@")
	require.NotEmpty(t, link)
	for _, l := range cluster.Leftovers() {
		assert.False(t, strings.HasPrefix(l, "network namespace") || strings.HasPrefix(l, "link "), "left over: %s", l)
	}
}

// BenchmarkBulkPods measures making and removing 1 000 pods in one namespace.
func BenchmarkBulkPods(b *testing.B) {
	c := cluster.Start(b, cluster.Options{})
	ns := c.Env.CreateNamespaceForTest(b, "bench")
	i := 0
	for b.Loop() {
		i++
		bulk, err := c.NewBulkPods(b.Context(), cluster.BulkSpec{Namespace: ns, NamePrefix: "b" + strconv.Itoa(i), Count: 1000, Port: 8080})
		if err != nil {
			b.Fatal(err)
		}
		if err := bulk.Remove(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}
