// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package upgrade_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
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
		{name: "releases with HEAD's product: the newest that differs", rels: rels, isHead: headIs("c3", "c2"), want: "0.1.0"},
		{name: "only HEAD's release", rels: rels[:1], isHead: headIs("c3"), wantErr: "no release whose product differs"},
		{name: "no release", isHead: headIs(), wantErr: "no release whose product differs"},
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

func TestUpgradeSources(t *testing.T) {
	rels := []release{{Version: "0.3.0", Commit: "c3"}, {Version: "0.2.0", Commit: "c2"}, {Version: "0.1.0", Commit: "c1"}}
	sameAs := func(commits ...string) func(release) (bool, error) {
		return func(r release) (bool, error) { return slices.Contains(commits, r.Commit), nil }
	}
	for _, tc := range []struct {
		name    string
		rels    []release
		same    func(release) (bool, error)
		want    []string
		wantErr string
	}{
		{name: "between releases: the newest and the oldest", rels: rels, same: sameAs(), want: []string{"0.3.0", "0.1.0"}},
		{name: "at a release: the one before and the oldest", rels: rels, same: sameAs("c3"), want: []string{"0.2.0", "0.1.0"}},
		{name: "the one before is the oldest: once", rels: rels, same: sameAs("c3", "c2"), want: []string{"0.1.0"}},
		{name: "one release below HEAD", rels: rels[1:], same: sameAs(), want: []string{"0.2.0", "0.1.0"}},
		{name: "the oldest has HEAD's product", rels: rels, same: sameAs("c1"), wantErr: "out of order"},
		{name: "every release has HEAD's product", rels: rels, same: sameAs("c3", "c2", "c1"), wantErr: "no release whose product differs"},
		{name: "a commit not fetched", rels: rels, same: func(release) (bool, error) { return false, errors.New("fetch it") }, wantErr: "fetch it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := upgradeSources(tc.rels, tc.same)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			var versions []string
			for _, r := range got {
				versions = append(versions, r.Version)
			}
			assert.Equal(t, tc.want, versions)
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

// TestReleaseCommitsInAClone runs the git side on real repositories: a release commit that
// differs from HEAD only outside the product (the release record, docs, tests) ships HEAD's
// product, one that differs in a program does not; a commit the clone lacks is fetched from
// the clone's remote (its tag) when it has one, and otherwise fails with what to fetch.
func TestReleaseCommitsInAClone(t *testing.T) {
	dir := t.TempDir()
	run := func(dir string, args ...string) string {
		t.Helper()
		out, err := git(dir, args...)
		require.NoError(t, err)
		return out
	}
	write := func(name, text string) {
		t.Helper()
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	}
	run(dir, "init", "-q")
	run(dir, "config", "user.email", "test@example.com")
	run(dir, "config", "user.name", "test")
	write("images/agent/main.go", "package main\n")
	write("CHANGELOG.md", "## Unreleased\n")
	run(dir, "add", ".")
	run(dir, "commit", "-qm", "one")
	cut := run(dir, "rev-parse", "--short", "HEAD")
	run(dir, "tag", "v0.1.0")
	write("CHANGELOG.md", "## Unreleased\n\n## v0.1.0\n\nCommit: `"+cut+"`\n")
	write("Chart.yaml", "version: 0.1.0\n")
	write("tests/e2e/x_test.go", "package e2e\n")
	write("docs/README.md", "docs\n")
	run(dir, "add", ".")
	run(dir, "commit", "-qm", "Release v0.1.0, then tests and docs")
	same := sameProduct(dir)

	got, err := same(release{Version: "0.1.0", Commit: cut})
	require.NoError(t, err)
	assert.True(t, got, "only the release record, tests and docs changed")

	write("images/agent/main.go", "package main\n\nfunc main() {}\n")
	run(dir, "commit", "-qam", "two")
	got, err = same(release{Version: "0.1.0", Commit: cut})
	require.NoError(t, err)
	assert.False(t, got, "a program changed since the release")

	_, err = same(release{Version: "0.0.1", Commit: "0123456789abcdef"})
	require.ErrorContains(t, err, "git fetch --unshallow")
	assert.ErrorContains(t, err, "git fetch origin 0123456789abcdef")
	assert.ErrorContains(t, err, "no remote")

	// A shallow clone of HEAD alone: the release commit is fetched with its tag.
	clone := t.TempDir()
	run(clone, "clone", "-q", "--depth=1", "--no-tags", "file://"+dir, ".")
	_, err = git(clone, "rev-parse", "--verify", "--quiet", cut+"^{commit}")
	require.Error(t, err, "the shallow clone lacks the release commit")
	got, err = sameProduct(clone)(release{Version: "0.1.0", Commit: cut})
	require.NoError(t, err, "the release commit is fetched")
	assert.False(t, got)
}

// TestSliceMonitorEndpointMoves feeds the slice monitor the changes an agent makes when it
// splits a port's endpoints on a node into a chunk and merges them back, in the publisher's
// order (the receiving slice written first) and in the wrong one: only the wrong one is a
// violation, and the right one is reported as a move into and out of a chunk.
func TestSliceMonitorEndpointMoves(t *testing.T) {
	const a, b = "10.0.0.2", "10.0.0.3"
	common := slicemeta.SliceKey{Resource: "web", Node: "node-a"}
	chunk := slicemeta.SliceKey{Resource: "web", Node: "node-a", Chunk: 1}
	type change struct {
		typ watch.EventType
		key slicemeta.SliceKey
		eps []string
	}
	cases := []struct {
		name       string
		changes    []change
		violations int
		into, out  bool
	}{
		{"split: chunk created, then the common slice updated", []change{
			{watch.Added, chunk, []string{b}}, {watch.Modified, common, []string{a}},
		}, 0, true, false},
		{"split: the common slice updated before the chunk exists", []change{
			{watch.Modified, common, []string{a}}, {watch.Added, chunk, []string{b}},
		}, 1, false, false},
		{"merge: the common slice updated, then the chunk deleted", []change{
			{watch.Added, chunk, []string{b}}, {watch.Modified, common, []string{a}},
			{watch.Modified, common, []string{a, b}}, {watch.Deleted, chunk, []string{b}},
		}, 0, true, true},
		{"merge: the chunk deleted before the common slice lists its endpoint", []change{
			{watch.Added, chunk, []string{b}}, {watch.Modified, common, []string{a}},
			{watch.Deleted, chunk, []string{b}}, {watch.Modified, common, []string{a, b}},
		}, 1, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := &sliceMonitor{slices: map[string]publishedSlice{}}
			m.onList([]runtime.Object{monitoredSlice(common, a, b)})
			_, err := m.Hold([]string{"web/"})
			require.NoError(t, err)
			for _, c := range tc.changes {
				m.onEvent(watch.Event{Type: c.typ, Object: monitoredSlice(c.key, c.eps...)})
			}
			v, _, _ := m.Report()
			// A lost endpoint is reported by the move rule, and as not ready until it is back.
			if tc.violations == 0 {
				assert.Empty(t, v)
			} else {
				require.NotEmpty(t, v)
				assert.Contains(t, v[0], "endpoint "+b+" left slice")
			}
			moves := m.Moves()
			assert.Equal(t, tc.into, slices.ContainsFunc(moves, endpointMove.intoChunk), "a move into the chunk: %v", moves)
			assert.Equal(t, tc.out, slices.ContainsFunc(moves, endpointMove.outOfChunk), "a move out of the chunk: %v", moves)
		})
	}
}

// monitoredSlice is an IPv4 slice of the module for key listing the addresses ready.
func monitoredSlice(key slicemeta.SliceKey, addrs ...string) *discoveryv1.EndpointSlice {
	yes := true
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: key.Name(), Labels: key.Labels(), Annotations: key.Annotations()},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, addr := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes}})
	}
	return s
}
