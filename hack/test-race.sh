#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Runs the agent's, the controller's and testkit's tests with the race detector and the
# informer-cache mutation detector: what `make test-race` runs after `make deps test-tools`.
#
#   hack/test-race.sh                 ./images/agent/... ./images/controller/... ./testkit/...
#   hack/test-race.sh PACKAGE...      those packages only (e.g. ./images/controller/internal/controller)
#
# Environment: GO_TEST_FLAGS (default -count=1 -timeout=60m -vet=off), RACE_PARALLEL (test
# binaries run at once, default 2).
#
# -race needs cgo (CGO_ENABLED=1, gcc). Only this script's `go test` sees that and -race: the
# pinned tools (tools/build.sh, built by the Makefile's prerequisites) are never built with it,
# and the programs the tests start are built with -race into binaries of their own
# (testkit/process.Build: a "-race" suffix), so a race run leaves what `make test` reuses alone.
# The test binaries run two at a time by default, the longest (the agent's, about 230 s) first:
# one at a time, the run used 0.7 of the two cores (2026-12-07, development/BENCHMARKS-HISTORY.md,
# "A fresh .ci/run"), because the suites wait on real API servers, probes and graces far more than
# they compute, even with the race detector's 2-10 times slower code. RACE_PARALLEL=1 runs them
# one by one again.
#
# KUBE_CACHE_MUTATION_DETECTOR=true makes client-go keep a copy of every object an informer
# adds and panic when the cached object no longer equals it: the agent and the controller read
# their caches without copies (client.UnsafeDisableDeepCopy, the pod indexer), so a write
# through such a pointer is a bug that no other test sees. client-go reads the variable once,
# when the test binary starts.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

GO_TEST_FLAGS=${GO_TEST_FLAGS:--count=1 -timeout=60m -vet=off}
RACE_PARALLEL=${RACE_PARALLEL:-2}
pkgs=("$@")
# go test starts packages in the order given (a package named twice runs once): the longest first.
[[ ${#pkgs[@]} -gt 0 ]] || pkgs=(./images/agent/internal/agent ./images/agent/... ./images/controller/... ./testkit/...)

export CGO_ENABLED=1
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath"
export KUBE_CACHE_MUTATION_DETECTOR=true

started=$(date +%s)
# The test binaries are built first, all at once (`-exec true` builds and does not run them),
# so that RACE_PARALLEL limits only the runs.
# shellcheck disable=SC2086 # GO_TEST_FLAGS is a list of flags.
go test -race $GO_TEST_FLAGS -exec true "${pkgs[@]}" >/dev/null
echo "test-race: built in $(($(date +%s) - started))s" >&2
status=0
# shellcheck disable=SC2086
go test -race -p "$RACE_PARALLEL" $GO_TEST_FLAGS "${pkgs[@]}" || status=$?
echo "test-race: done in $(($(date +%s) - started))s (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
exit "$status"
