// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package werf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/modfile"
	"sigs.k8s.io/yaml"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// ossModules maps each oss.yaml id to the Go module it stands for.
var ossModules = map[string]string{
	"controller-runtime":       "sigs.k8s.io/controller-runtime",
	"client-go":                "k8s.io/client-go",
	"pgx":                      "github.com/jackc/pgx/v5",
	"prometheus-client-golang": "github.com/prometheus/client_golang",
	"module-sdk":               "github.com/deckhouse/module-sdk",
}

// imageModules are the Go modules built into the module's images.
var imageModules = []string{"images/controller", "images/agent", "hooks"}

// TestOSSListsTheVersionsTheImagesAreBuiltWith: each oss.yaml project's versions are exactly the
// versions the images' go.mod files require, so the list cannot drift from the builds.
func TestOSSListsTheVersionsTheImagesAreBuiltWith(t *testing.T) {
	root, err := bundle.Root()
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(root, "oss.yaml"))
	require.NoError(t, err)
	var projects []struct {
		ID       string `json:"id"`
		Version  string `json:"version"`
		Versions []struct {
			Version string `json:"version"`
		} `json:"versions"`
	}
	require.NoError(t, yaml.Unmarshal(data, &projects))

	required := map[string]map[string]bool{}
	for _, m := range imageModules {
		raw, err := os.ReadFile(filepath.Join(root, m, "go.mod"))
		require.NoError(t, err)
		f, err := modfile.Parse(m+"/go.mod", raw, nil)
		require.NoError(t, err)
		for _, r := range f.Require {
			if r.Indirect {
				continue
			}
			if required[r.Mod.Path] == nil {
				required[r.Mod.Path] = map[string]bool{}
			}
			required[r.Mod.Path][strings.TrimPrefix(r.Mod.Version, "v")] = true
		}
	}
	require.Len(t, projects, len(ossModules), "every oss.yaml project has its Go module here")
	for _, p := range projects {
		t.Run(p.ID, func(t *testing.T) {
			module, ok := ossModules[p.ID]
			require.True(t, ok, "oss.yaml project %s has no Go module in this test", p.ID)
			listed := map[string]bool{}
			if p.Version != "" {
				listed[p.Version] = true
			}
			for _, v := range p.Versions {
				listed[v.Version] = true
			}
			assert.Equal(t, required[module], listed, "oss.yaml %s lists the versions of %s the images require directly", p.ID, module)
		})
	}
}
