// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cmdline

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	// contextFile names a context and its cluster and user, but not where the cluster is.
	contextFile = `apiVersion: v1
kind: Config
current-context: ctx
contexts:
- name: ctx
  context: {cluster: c, user: u}
`
	// clusterFile says where cluster c is and who user u is.
	clusterFile = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: u
  user: {token: secret}
`
)

func TestRESTConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(text), 0o600))
		return p
	}
	whole := write("whole", contextFile+strings.TrimPrefix(clusterFile, "apiVersion: v1\nkind: Config\n"))
	contexts, clusters := write("contexts", contextFile), write("clusters", clusterFile)
	missing := filepath.Join(dir, "missing")
	list := func(paths ...string) string { return strings.Join(paths, string(filepath.ListSeparator)) }

	tests := map[string]struct {
		kubeconfig string
		wantErr    string // empty when the configuration loads
	}{
		"one kubeconfig file is read":                 {kubeconfig: whole},
		"a list of files is merged like kubectl does": {kubeconfig: list(contexts, clusters)},
		"a missing file in a list is skipped":         {kubeconfig: list(missing, whole)},
		"one missing file is an error that names it":  {kubeconfig: missing, wantErr: "loading kubeconfig " + missing + ": "},
		"a file without the cluster is an error":      {kubeconfig: contexts, wantErr: "loading kubeconfig " + contexts},
		"no kubeconfig outside a cluster is an error": {kubeconfig: "", wantErr: "no --kubeconfig or $KUBECONFIG and not running in a cluster"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv("KUBERNETES_SERVICE_HOST", "")
			t.Setenv("KUBERNETES_SERVICE_PORT", "")
			c := Common{Kubeconfig: tc.kubeconfig, KubeAPIQPS: 20.5, KubeAPIBurst: 7}
			cfg, err := c.RESTConfig("prog/node-a")
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, "https://127.0.0.1:6443", cfg.Host)
			assert.Equal(t, "secret", cfg.BearerToken)
			assert.Equal(t, float32(20.5), cfg.QPS)
			assert.Equal(t, 7, cfg.Burst)
			assert.Equal(t, "prog/node-a", cfg.UserAgent)
		})
	}
}
