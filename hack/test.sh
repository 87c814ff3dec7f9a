#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Runs every test of every module: what `make test` runs after `make deps test-tools`.
#
#   hack/test.sh              the workspace modules and, beside them, the standalone ones
#
# Environment: GO_TEST_FLAGS (default -count=1 -timeout=30m -vet=off: go vet is make verify's),
# MODULES and STANDALONE (the Makefile passes its lists).
#
# One build configuration for everything: the tests build with CGO_ENABLED=0 and -trimpath,
# the flags hack/build-images.sh builds the images with. tests/werf runs that script from a copy
# of the include paths, and tests/monitoring builds the programs outside the workspace; with the
# same flags every one of those builds finds the dependencies already compiled by the test
# binaries, where before each configuration compiled Kubernetes' client libraries again (about
# six of the fresh machine's minutes: development/BENCHMARKS.md, "make test").
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

GO_TEST_FLAGS=${GO_TEST_FLAGS:--count=1 -timeout=30m -vet=off}
read -r -a modules <<<"${MODULES:-api lib testkit images/agent images/controller hooks tests}"
read -r -a standalone <<<"${STANDALONE:-tests/monitoring}"

export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath"

started=$(date +%s)
phase() { echo "test: $1 in $(($(date +%s) - $2))s (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2; }

# kube-rbac-proxy is the one tool the first tests do not need (only tests/installed runs it, and
# it waits for this build through tools/build.sh): building it beside the first tests puts its
# minutes on a fresh machine into the time the tests spend waiting on API servers and probes.
tools_log=$(mktemp)
"$root/tools/build.sh" kube-rbac-proxy >"$tools_log" 2>&1 &
tools_pid=$!

# The standalone modules (tests/monitoring: compiling Prometheus' PromQL parser is most of its
# time) run beside the workspace's tests, whose packages spend most of their time waiting on API
# servers, probes and timeouts: the two cores stay busy without a third heavy suite.
standalone_log=$(mktemp)
trap 'rm -f "$standalone_log" "$tools_log" "${go_log:-}"' EXIT
(
	for m in "${standalone[@]}"; do
		t=$(date +%s)
		# shellcheck disable=SC2086 # GO_TEST_FLAGS is a list of flags.
		(cd "$m" && GOWORK=off go test $GO_TEST_FLAGS ./...) || exit 1
		phase "$m" "$t"
	done
) >"$standalone_log" 2>&1 &
standalone_pid=$!

# The longest packages first (development/BENCHMARKS.md, "make test"): go test starts packages in
# the order it is given them, and a long one started last is the whole run's tail. A package
# named twice runs once. tests/e2e/upgrade (its TestMain builds the releases to upgrade from on a
# fresh machine, then the upgrades under traffic) and images/agent/internal/agent each run their
# tests as two isolated processes side by side (testkit/shard: the tests wait on upgrades, probes
# and graces, not on CPU), so each holds its slot for about half of its tests' time (upgrade
# about 170 s of 340, the agent about 110 of 210).
pkgs=(./tests/e2e/upgrade ./images/agent/internal/agent ./testkit/cluster ./tests/e2e/... ./testkit/cmd/swh-run)
for m in "${modules[@]}"; do pkgs+=("./$m/..."); done
t=$(date +%s)
status=0
go_log=$(mktemp)
# shellcheck disable=SC2086
go test $GO_TEST_FLAGS "${pkgs[@]}" 2>&1 | tee "$go_log" || status=$?
phase "workspace modules" "$t"
# Where the minutes went: go test's time per package is its test binary's run (the build is not
# in it); the longest ones decide how long the phase takes (development/BENCHMARKS.md).
echo "test: the longest packages (their tests' run, without the build): $(awk '($1 == "ok" || $1 == "FAIL") && $3 ~ /^[0-9.]+s$/ {sub(/s$/, "", $3); print $3, $2}' "$go_log" |
	sort -rn | head -8 | awk '{sub(/^github.com\/deckhouse\/service-with-healthchecks\//, "", $2); printf "%s%s %ss", (NR > 1 ? ", " : ""), $2, $1}')" >&2
rm -f "$go_log"

wait "$tools_pid" || { status=1; cat "$tools_log" >&2; }
wait "$standalone_pid" || status=$?
cat "$standalone_log"
phase "all tests" "$started"
exit "$status"
