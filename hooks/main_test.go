// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wantHooks are the hooks the binary must carry, by the names module-sdk gives them (their
// file paths under hooks/).
var wantHooks = []string{"crds/ensure", "credentials/credentials", "settings/settings"}

// buildHooks builds the hooks binary. The bundle's binary is built by hack/build-images.sh
// (static, -trimpath); that configuration compiles every dependency again, which takes more than
// ten minutes on a small machine, so the test builds with the test's own build cache. module-sdk
// names hooks by the part of the source path after "/hooks/", which -trimpath keeps.
func buildHooks(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "hooks")
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", bin, ".")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

func TestBinaryListsAndConfiguresEveryHook(t *testing.T) {
	bin := buildHooks(t)

	out, err := exec.CommandContext(t.Context(), bin, "hooks", "list").CombinedOutput()
	require.NoError(t, err, "hooks list: %s", out)
	assert.Contains(t, string(out), "Found 3 items:")
	for _, h := range wantHooks {
		assert.Contains(t, string(out), " - "+h+"\n", "hooks list names %s", h)
	}

	out, err = exec.CommandContext(t.Context(), bin, "hooks", "config").Output()
	require.NoError(t, err, "hooks config: %s", out)
	var cfg struct {
		Version string           `json:"configVersion"`
		Hooks   []map[string]any `json:"hooks"`
	}
	require.NoError(t, json.Unmarshal(out, &cfg), "hooks config prints JSON: %s", out)
	require.Len(t, cfg.Hooks, len(wantHooks))
	text := string(out)
	for _, want := range []string{
		`"onStartup":5`,
		`"kind":"ServiceWithHealthchecks"`,
		`"kind":"Secret"`,
		`"network.deckhouse.io/postgresql-credentials"`,
		`"network.deckhouse.io/mysql-credentials"`,
	} {
		assert.True(t, strings.Contains(strings.ReplaceAll(text, " ", ""), want), "hooks config has %s: %s", want, out)
	}
}
