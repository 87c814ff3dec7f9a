// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package upgrade_test upgrades the module from the newest release recorded in CHANGELOG.md
// to HEAD and rolls it back, under traffic, with the real programs of both: the release is
// built from its own commit (git archive, its hack/build-images.sh) into the tool cache once,
// and run on the cluster harness (testkit/stack) with its CRD, its chart's flags and its
// docs/examples, then replaced the way the platform replaces it (CRD, controller Deployment
// rollout, agent DaemonSet node by node) while request loops go through every Service's
// ClusterIP through a real kube-proxy. development/E2E.md ("Upgrade and rollback") describes it.
package upgrade_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

// releaseEnv carries the built release (or why it could not be built) from the outer test
// process, which has the machine's network for the module proxy, into the isolated one.
const releaseEnv = "SWH_UPGRADE_PREVIOUS_RELEASE"

// preparedRelease is what releaseEnv holds.
type preparedRelease struct {
	Built builtRelease `json:"built"`
	Err   string       `json:"err,omitempty"`
	// NotInClone is set when the release's commit is not in this clone (a shallow clone): the
	// test skips, saying what to fetch, as tests/release does; everything else fails it.
	NotInClone bool `json:"notInClone,omitempty"`
}

// TestMain builds the previous release before the binary isolates itself (the isolated network
// reaches no module proxy), then isolates it (cluster.RunIsolated). Without root nothing is
// built: the tests that need it skip.
func TestMain(m *testing.M) {
	if os.Getenv(releaseEnv) == "" && !cluster.Isolated() && os.Geteuid() == 0 {
		var p preparedRelease
		started := time.Now()
		b, err := prepare()
		p.Built = b
		if err != nil {
			p.Err = err.Error()
			p.NotInClone = errors.Is(err, errNotInClone)
		} else {
			fmt.Fprintf(os.Stderr, "upgrade: previous release v%s (%s) ready in %s: %s\n", b.Version, b.Commit, time.Since(started).Round(time.Millisecond), b.Dir)
		}
		data, err := json.Marshal(p)
		if err != nil {
			panic(err)
		}
		if err := os.Setenv(releaseEnv, string(data)); err != nil {
			panic(err)
		}
	}
	cluster.RunIsolated(m)
}

// prepare finds the newest release below HEAD and builds it into the tool cache.
func prepare() (builtRelease, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return builtRelease{}, err
	}
	data, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		return builtRelease{}, err
	}
	releases, err := parseReleases(data)
	if err != nil {
		return builtRelease{}, fmt.Errorf("CHANGELOG.md: %w", err)
	}
	prev, err := previousRelease(releases, isHeadRelease(root))
	if err != nil {
		return builtRelease{}, err
	}
	return buildRelease(root, prev)
}

// previous is the release TestMain built; it fails the test when that failed.
func previous(t *testing.T) builtRelease {
	t.Helper()
	var p preparedRelease
	if err := json.Unmarshal([]byte(os.Getenv(releaseEnv)), &p); err != nil {
		t.Fatalf("the previous release was not prepared by TestMain ($%s): %v", releaseEnv, err)
	}
	if p.NotInClone {
		t.Skipf("preparing the previous release: %s", p.Err)
	}
	if p.Err != "" {
		t.Fatalf("preparing the previous release: %s", p.Err)
	}
	return p.Built
}
