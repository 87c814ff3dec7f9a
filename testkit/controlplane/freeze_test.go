// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controlplane_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

// Freeze makes this Env's API server stop answering and Thaw brings it back; APIServerPID names
// a kube-apiserver process.
func TestFreezeStopsTheAPIServerAndThawResumesIt(t *testing.T) {
	env := controlplane.StartForTest(t, controlplane.Options{})
	pid, err := env.APIServerPID()
	require.NoError(t, err)
	comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
	require.NoError(t, err)
	assert.Equal(t, "kube-apiserver", strings.TrimSpace(string(comm)))

	list := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		defer cancel()
		return env.Client.List(ctx, &corev1.NamespaceList{}, client.Limit(1))
	}
	require.NoError(t, list(10*time.Second), "the API server answers before the freeze")

	require.NoError(t, env.Freeze())
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			_ = env.Thaw()
		}
	})
	assert.Error(t, list(time.Second), "a frozen API server does not answer")
	require.NoError(t, env.Thaw())
	thawed = true
	require.NoError(t, list(10*time.Second), "the API server answers after the thaw")
}
