// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package upgrade_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseReleases(t *testing.T) {
	for _, tc := range []struct {
		name    string
		text    string
		want    []release
		wantErr string
	}{
		{name: "none", text: "# Changelog\n\n## Unreleased\n\n- a\n"},
		{
			name: "unreleased then two releases, newest first",
			text: "# Changelog\n\n## Unreleased\n\nCommit: `ffffff0`\n\n## v0.2.0\n\nCommit: `ABCDEF1234`\n\n### Features\n\n## v0.1.0\n\nCommit: 6c6bd7e\n",
			want: []release{{Version: "0.2.0", Commit: "abcdef1234"}, {Version: "0.1.0", Commit: "6c6bd7e"}},
		},
		{
			name: "only the first commit line of a section counts",
			text: "## v1.0.0\nCommit: `1111111`\nCommit: `2222222`\n",
			want: []release{{Version: "1.0.0", Commit: "1111111"}},
		},
		{name: "a release without a commit", text: "## v0.2.0\n\n### Fixes\n\n## v0.1.0\nCommit: `6c6bd7e`\n", wantErr: "v0.2.0 records no"},
		{name: "not a version heading", text: "## v0.1\nCommit: `6c6bd7e`\n"},
		{name: "a commit too short", text: "## v0.1.0\nCommit: `6c6b`\n", wantErr: "v0.1.0 records no"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseReleases([]byte(tc.text))
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestPreviousRelease(t *testing.T) {
	rels := []release{{Version: "0.3.0", Commit: "c3"}, {Version: "0.2.0", Commit: "c2"}, {Version: "0.1.0", Commit: "c1"}}
	headIs := func(commits ...string) func(release) (bool, error) {
		return func(r release) (bool, error) {
			for _, c := range commits {
				if r.Commit == c {
					return true, nil
				}
			}
			return false, nil
		}
	}
	for _, tc := range []struct {
		name    string
		rels    []release
		isHead  func(release) (bool, error)
		want    string
		wantErr string
	}{
		{name: "between releases: the newest", rels: rels, isHead: headIs(), want: "0.3.0"},
		{name: "at a release: the one before", rels: rels, isHead: headIs("c3"), want: "0.2.0"},
		{name: "only HEAD's release", rels: rels[:1], isHead: headIs("c3"), wantErr: "no release below HEAD"},
		{name: "no release", isHead: headIs(), wantErr: "no release below HEAD"},
		{name: "a commit not in the clone", rels: rels, isHead: func(release) (bool, error) { return false, errors.New("fetch it") }, wantErr: "fetch it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := previousRelease(tc.rels, tc.isHead)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.Version)
		})
	}
}

func TestProgramArgs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    []string
		wantErr string
	}{
		{
			name: "the stack's own flags go",
			args: []string{"--node-name=$(NODE_NAME)", "--metrics-bind-address=127.0.0.1:4281", "--health-probe-bind-address=:8081", "--kubeconfig=/x", "--lease-renew-interval=2s", "--log-level=info"},
			want: []string{"--lease-renew-interval=2s", "--log-level=info"},
		},
		{name: "a flag that only starts like one stays", args: []string{"--node-names-cache=3"}, want: []string{"--node-names-cache=3"}},
		{name: "the environment elsewhere", args: []string{"--pod=$(POD_NAME)"}, wantErr: "refers to the pod's environment"},
		{name: "none", args: nil, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := programArgs(tc.args)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestAddedFields(t *testing.T) {
	obj := func(props map[string]any) map[string]any {
		return map[string]any{"type": "object", "properties": props}
	}
	str := map[string]any{"type": "string"}
	base := obj(map[string]any{
		"spec": obj(map[string]any{
			"ports":  map[string]any{"type": "array", "items": obj(map[string]any{"port": str})},
			"policy": str,
		}),
		"status": obj(map[string]any{"clusterIP": str}),
	})
	for _, tc := range []struct {
		name         string
		older, newer map[string]any
		want         []string
	}{
		{name: "the same", older: base, newer: base, want: nil},
		{
			name:  "fields added at every depth, a new object listed once",
			older: base,
			newer: obj(map[string]any{
				"spec": obj(map[string]any{
					"ports":  map[string]any{"type": "array", "items": obj(map[string]any{"port": str, "appProtocol": str})},
					"policy": str,
					"grpc":   obj(map[string]any{"service": str}),
				}),
				"status": obj(map[string]any{"clusterIP": str, "budget": str}),
			}),
			want: []string{"spec.grpc", "spec.ports[].appProtocol", "status.budget"},
		},
		{name: "a field removed is not added", older: base, newer: obj(map[string]any{"spec": obj(map[string]any{"policy": str})}), want: nil},
		{name: "a new version", newer: obj(map[string]any{"spec": str}), want: []string{"spec"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, addedFields(tc.older, tc.newer))
		})
	}
}

func TestHasPath(t *testing.T) {
	o := map[string]any{"spec": map[string]any{
		"probes": []any{map[string]any{"mode": "HTTP"}, map[string]any{"mode": "GRPC", "grpc": map[string]any{"service": "x"}}},
		"policy": "a",
	}}
	for _, tc := range []struct {
		path string
		want bool
	}{
		{"spec.policy", true},
		{"spec.probes[].grpc", true},
		{"spec.probes[].grpc.service", true},
		{"spec.probes[].http", false},
		{"spec.missing", false},
		{"spec.policy.deeper", false},
		{"status", false},
	} {
		t.Run(tc.path, func(t *testing.T) {
			assert.Equal(t, tc.want, hasPath(o, splitPath(tc.path)))
		})
	}
}

// TestReleaseCommitsInAClone runs the git side on a real repository: a release commit that
// differs from HEAD only in the release record is HEAD, one that differs in a program is not,
// and a commit the clone lacks fails with what to fetch.
func TestReleaseCommitsInAClone(t *testing.T) {
	dir := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		out, err := git(dir, args...)
		require.NoError(t, err)
		return out
	}
	write := func(name, text string) {
		t.Helper()
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	}
	run("init", "-q")
	run("config", "user.email", "test@example.com")
	run("config", "user.name", "test")
	write("main.go", "package main\n")
	write("CHANGELOG.md", "## Unreleased\n")
	run("add", ".")
	run("commit", "-qm", "one")
	cut := run("rev-parse", "--short", "HEAD")
	write("CHANGELOG.md", "## Unreleased\n\n## v0.1.0\n\nCommit: `"+cut+"`\n")
	write("Chart.yaml", "version: 0.1.0\n")
	run("add", ".")
	run("commit", "-qm", "Release v0.1.0")
	isHead := isHeadRelease(dir)

	same, err := isHead(release{Version: "0.1.0", Commit: cut})
	require.NoError(t, err)
	assert.True(t, same, "the release commit changes only the record")

	write("main.go", "package main\n\nfunc main() {}\n")
	run("commit", "-qam", "two")
	same, err = isHead(release{Version: "0.1.0", Commit: cut})
	require.NoError(t, err)
	assert.False(t, same, "a program changed since the release")

	_, err = isHead(release{Version: "0.0.1", Commit: "0123456789abcdef"})
	require.ErrorContains(t, err, "git fetch --unshallow")
	assert.ErrorContains(t, err, "git fetch origin 0123456789abcdef")
}
