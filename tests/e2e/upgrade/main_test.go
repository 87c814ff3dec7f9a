// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package upgrade_test upgrades the module to HEAD from the newest release recorded in
// CHANGELOG.md whose product differs from HEAD's and from the oldest recorded, and rolls it
// back, under traffic, with the real programs of both and the chart's RBAC and admission
// policies in force (every program runs as its ServiceAccount): a release is
// built from its own commit (git archive, its hack/build-images.sh) into the tool cache once,
// and run on the cluster harness (testkit/stack) with its CRD, its chart's flags and its
// docs/examples, then replaced the way the platform replaces it (CRD, controller Deployment
// rollout, agent DaemonSet node by node) while request loops go through every Service's
// ClusterIP through a real kube-proxy. development/E2E.md ("Upgrade and rollback") describes it.
package upgrade_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/shard"
)

// releaseEnv carries the built releases (or why they could not be built) from the outer test
// process, which has the machine's network for the module proxy and the clone's remote, into
// the isolated one.
const releaseEnv = "SWH_UPGRADE_PREVIOUS_RELEASE"

// preparedReleases is what releaseEnv holds.
type preparedReleases struct {
	// Built are the releases to upgrade from (upgradeSources), newest first.
	Built []builtRelease `json:"built"`
	Err   string         `json:"err,omitempty"`
}

// TestMain builds the releases to upgrade from before the binary isolates itself (the isolated
// network reaches no module proxy), then runs the tests in two processes (shardTests), each of
// which isolates itself (cluster.RunIsolated). Without root
// nothing is built: the tests that need it skip.
func TestMain(m *testing.M) {
	if os.Getenv(releaseEnv) == "" && !cluster.Isolated() && os.Geteuid() == 0 {
		var p preparedReleases
		started := time.Now()
		built, err := prepare()
		p.Built = built
		if err != nil {
			p.Err = err.Error()
		}
		for _, b := range built {
			fmt.Fprintf(os.Stderr, "upgrade: release v%s (%s) ready: %s\n", b.Version, b.Commit, b.Dir)
		}
		fmt.Fprintf(os.Stderr, "upgrade: releases prepared in %s\n", time.Since(started).Round(time.Millisecond))
		data, err := json.Marshal(p)
		if err != nil {
			panic(err)
		}
		if err := os.Setenv(releaseEnv, string(data)); err != nil {
			panic(err)
		}
	}
	if code, ran := shard.Run(shardEnv, shardTests); ran {
		os.Exit(code)
	}
	cluster.RunIsolated(m)
}

// The package's tests wait on upgrades under traffic (about 380 s of runs, 250 s of CPU, with
// the releases built), and it is the longest package of `make test`: a plain run is two
// processes side by side (testkit/shard), each isolated with its own clusters, after TestMain
// built the releases once for both. shardTests (about 175 s: the upgrade from the oldest
// release, the GRPC/MySQL rollback, the pruned field) run in one, the rest (about 200 s: the
// upgrade from the previous release, the drain's upgrade and rollback) in the other.
const (
	shardEnv   = "SWH_UPGRADE_TEST_SHARD"
	shardTests = `^(TestReleaseUpgradeAndRollbackUnderTrafficFromTheOldestRelease` +
		`|TestRollbackToAReleaseWithoutTheGRPCAndMySQLModesAndThePlatformOperatorsWay` +
		`|TestRollbackPrunesAFieldOfTheLaterReleaseAndAWriteDropsIt)$`
)

// prepare finds the releases to upgrade from (upgradeSources) and builds them into the tool
// cache.
func prepare() ([]builtRelease, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		return nil, err
	}
	releases, err := parseReleases(data)
	if err != nil {
		return nil, fmt.Errorf("CHANGELOG.md: %w", err)
	}
	sources, err := upgradeSources(releases, sameProduct(root))
	if err != nil {
		return nil, err
	}
	var out []builtRelease
	for _, r := range sources {
		b, err := buildRelease(root, r)
		if err != nil {
			return out, err
		}
		out = append(out, b)
	}
	return out, nil
}

// sources are the releases TestMain built; it fails the test when that failed (a release's
// commit missing from the clone and not fetchable included: the message says what to fetch).
func sources(t *testing.T) []builtRelease {
	t.Helper()
	var p preparedReleases
	if err := json.Unmarshal([]byte(os.Getenv(releaseEnv)), &p); err != nil {
		t.Fatalf("the releases to upgrade from were not prepared by TestMain ($%s): %v", releaseEnv, err)
	}
	if p.Err != "" {
		t.Fatalf("preparing the releases to upgrade from: %s", p.Err)
	}
	if len(p.Built) == 0 {
		t.Fatal("no release to upgrade from was prepared")
	}
	return p.Built
}
