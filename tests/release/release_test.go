// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package release holds the module's lifecycle files to CHANGELOG.md, the record of releases:
// changelog.yaml (what Deckhouse reads from the release image) and Chart.yaml's version and
// appVersion (the programs' stamped version and the pods' app.kubernetes.io/version) say the
// newest release recorded there (development/RELEASING.md).
package release

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// releaseHeading is a release section of CHANGELOG.md.
var releaseHeading = regexp.MustCompile(`^## v(\d+)\.(\d+)\.(\d+)$`)

// newestRelease is the first release section of CHANGELOG.md: its version (with the v), its
// commit and its entries by group, each folded to one line.
func newestRelease(t *testing.T, changelog string) (version, commit string, groups map[string][]string) {
	t.Helper()
	groups = map[string][]string{}
	var group string
	for l := range strings.SplitSeq(changelog, "\n") {
		switch {
		case releaseHeading.MatchString(l):
			if version != "" {
				return version, commit, groups
			}
			version = strings.TrimPrefix(l, "## ")
		case version == "":
		case strings.HasPrefix(l, "Commit: "):
			commit = strings.Trim(strings.TrimPrefix(l, "Commit: "), "`")
		case strings.HasPrefix(l, "### "):
			group = strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(l, "### ")), " ", "_")
			groups[group] = nil
		case strings.HasPrefix(l, "- ") && group != "":
			groups[group] = append(groups[group], strings.TrimPrefix(l, "- "))
		case strings.HasPrefix(l, "  ") && group != "" && len(groups[group]) > 0:
			last := len(groups[group]) - 1
			groups[group][last] += " " + strings.TrimSpace(l)
		}
	}
	require.NotEmpty(t, version, "CHANGELOG.md records no release")
	return version, commit, groups
}

func read(t *testing.T, name string) string {
	t.Helper()
	root, err := bundle.Root()
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(root, name))
	require.NoError(t, err)
	return string(b)
}

func TestReleaseChangelogYAMLIsTheNewestReleaseOfCHANGELOG(t *testing.T) {
	version, commit, groups := newestRelease(t, read(t, "CHANGELOG.md"))
	var got map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(read(t, "changelog.yaml")), &got))
	assert.Equal(t, version, got["version"], "changelog.yaml's version")
	assert.Equal(t, commit, got["commit"], "changelog.yaml's commit")
	want := map[string]any{"version": version, "commit": commit}
	for g, entries := range groups {
		list := make([]any, len(entries))
		for i, e := range entries {
			list[i] = e
		}
		want[g] = list
	}
	assert.Equal(t, want, got, "changelog.yaml is hack/changelog-yaml.sh's output for CHANGELOG.md")
}

func TestReleaseChartVersionIsTheNewestRelease(t *testing.T) {
	version, _, _ := newestRelease(t, read(t, "CHANGELOG.md"))
	var chart struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(read(t, "Chart.yaml")), &chart))
	assert.Equal(t, strings.TrimPrefix(version, "v"), chart.Version, "Chart.yaml version")
	assert.Equal(t, strings.TrimPrefix(version, "v"), chart.AppVersion, "Chart.yaml appVersion (the programs' version, the pods' label)")
}

// TestReleaseEveryRecordedCommitExists: each release names a commit of this repository, and the
// releases are newest first with growing versions.
func TestReleaseEveryRecordedCommitExists(t *testing.T) {
	root, err := bundle.Root()
	require.NoError(t, err)
	var versions, commits []string
	for l := range strings.SplitSeq(read(t, "CHANGELOG.md"), "\n") {
		if releaseHeading.MatchString(l) {
			versions = append(versions, strings.TrimPrefix(l, "## v"))
		}
		if c, ok := strings.CutPrefix(l, "Commit: "); ok {
			commits = append(commits, strings.Trim(c, "`"))
		}
	}
	require.Len(t, commits, len(versions), "every release names its commit")
	require.Contains(t, versions, "0.1.0")
	for i, c := range commits {
		out, err := exec.CommandContext(t.Context(), "git", "-C", root, "rev-parse", "--verify", "--quiet", c+"^{commit}").CombinedOutput()
		if err != nil {
			t.Skipf("git cannot resolve %s here (a shallow clone?): %s", c, out)
		}
		if i > 0 {
			assert.True(t, semverLess(versions[i], versions[i-1]), "%s is listed below %s", versions[i], versions[i-1])
		}
	}
}

// semverLess tells whether version a (x.y.z) is below b.
func semverLess(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := range 3 {
		na, _ := strconv.Atoi(pa[i])
		nb, _ := strconv.Atoi(pb[i])
		if na != nb {
			return na < nb
		}
	}
	return false
}
