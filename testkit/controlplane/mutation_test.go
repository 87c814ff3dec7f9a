// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

const mutationChildEnv = "SWH_TEST_MUTATION_CHILD"

// DetectCacheMutations, called with the variable unset (as `go test` runs a package), turns
// client-go's detector on for the binary: an informer's cached object written through its
// pointer makes the binary panic with "cache *v1.Pod modified". The test runs this binary again
// as the child that does it.
func TestDetectCacheMutationsTurnsTheDetectorOn(t *testing.T) {
	if os.Getenv(mutationChildEnv) == "1" {
		mutateCachedPod()
		return
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestDetectCacheMutationsTurnsTheDetectorOn$", "-test.count=1")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, controlplane.CacheMutationDetectorEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	// The child's informer lists and watches a fixed pod: without the streaming list (a feature
	// of client-go on by default), which waits for a bookmark from an API server.
	cmd.Env = append(cmd.Env, mutationChildEnv+"=1", "KUBE_FEATURE_WatchListClient=false")
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	require.True(t, errors.As(err, &exitErr), "the child must fail (panic); it exited with %v:\n%s", err, out)
	assert.Contains(t, string(out), "cache *v1.Pod modified", "the child's output:\n%s", out)
	assert.NotContains(t, string(out), "not detected")
}

// mutateCachedPod turns the detector on, fills an informer with one pod, writes a label into
// the cached pod and waits for the detector's panic (it compares every second).
func mutateCachedPod() {
	controlplane.DetectCacheMutations()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", ResourceVersion: "1"}}
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			return &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: []corev1.Pod{*pod}}, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			return watch.NewFake(), nil
		},
	}
	inf := toolscache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, toolscache.Indexers{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go inf.RunWithContext(ctx)
	deadline := time.Now().Add(30 * time.Second)
	for !inf.HasSynced() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling for the sync, not synchronising on time
	}
	cached, ok, err := inf.GetStore().GetByKey("ns/p")
	if err != nil || !ok {
		fmt.Println("the pod is not in the cache:", ok, err)
		os.Exit(3)
	}
	cached.(*corev1.Pod).Labels = map[string]string{"written": "through the cache"}
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond) // the detector panics within its one-second period
	}
	fmt.Println("not detected")
	os.Exit(0)
}
