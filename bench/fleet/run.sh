#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Controller at cluster scale (issue 19 part 6): builds the controller program and this
# benchmark, then, per round and on a fresh kube-apiserver, simulates a fleet — FLEET_NODES Node
# objects whose agent Leases the benchmark renews on the agents' schedule, FLEET_RESOURCES
# resources with a slice on every node — and measures the controller at steady state (CPU over a
# window, RSS, API requests), the time to withdraw FLEET_STALE nodes whose Leases stop, the same
# steady state while they are stale, and FLEET_BURST resources created at once (time until every
# status is set, writes per resource, RSS). With FLEET_BASELINE=<git revision> it also builds the
# controller of that revision (in a temporary worktree) and alternates the two builds round by
# round. Prints a markdown section (development/BENCHMARKS-HISTORY.md, "Controller at cluster scale") on
# stdout; progress goes to stderr. No root needed.
#
# Heavy with its defaults (1,000 nodes, 10,000 slices, 10,000 resources at once: most of an
# hour per round and build on 2 cores); not part of `make test`. A smoke run takes a few minutes:
#
#   FLEET_NODES=20 FLEET_RESOURCES=3 FLEET_STALE=2 FLEET_BURST=100 FLEET_ROUNDS=1 \
#     FLEET_RENEW=1s FLEET_GRACE=6s FLEET_WINDOW=5s FLEET_STALE_WINDOW=5s bench/fleet/run.sh
#   FLEET_BASELINE=main bench/fleet/run.sh                     # the real figures, against main
#
# Knobs: FLEET_NODES (1000), FLEET_RESOURCES (10), FLEET_STALE (10), FLEET_BURST (10000),
# FLEET_ROUNDS (2), FLEET_RENEW (10s: the agents' renewal period), FLEET_GRACE (40s: the
# controller's --agent-lost-grace), FLEET_WINDOW (60s), FLEET_STALE_WINDOW (60s),
# FLEET_PHASES (steady,stale,burst), FLEET_TIMEOUT (1h per phase), FLEET_WRITERS (32),
# FLEET_ARGS (extra controller arguments for both builds, e.g. "--kube-api-qps=500
# --kube-api-burst=1000"), FLEET_CANDIDATE_ARGS (for the checked-out build only, e.g.
# "--max-concurrent-reconciles=4", which older builds do not know), FLEET_BASELINE (a git
# revision; none), CONTROLLER (an already built controller instead of building the checkout).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
cleanup() {
	[[ -d $tmp/base ]] && git -C "$root" worktree remove --force "$tmp/base" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT
controller="${CONTROLLER:-$tmp/controller}"
[[ -n ${CONTROLLER:-} ]] || (cd "$root" && go build -o "$controller" ./images/controller/cmd/controller)
baseline=()
if [[ -n ${FLEET_BASELINE:-} ]]; then
	git -C "$root" worktree add --detach "$tmp/base" "$FLEET_BASELINE" >&2
	(cd "$tmp/base" && go build -o "$tmp/controller-base" ./images/controller/cmd/controller)
	baseline=(-baseline "$tmp/controller-base")
fi
(cd "$root/bench/fleet" && GOWORK=off go build -o "$tmp/fleet" .)
# The control plane finds go.work (and the tool binaries) from the working directory.
cd "$root/bench/fleet"
"$tmp/fleet" -controller "$controller" "${baseline[@]}" \
	-nodes "${FLEET_NODES:-1000}" -resources "${FLEET_RESOURCES:-10}" -stale "${FLEET_STALE:-10}" \
	-burst "${FLEET_BURST:-10000}" -rounds "${FLEET_ROUNDS:-2}" -renew "${FLEET_RENEW:-10s}" \
	-grace "${FLEET_GRACE:-40s}" -window "${FLEET_WINDOW:-60s}" -stale-window "${FLEET_STALE_WINDOW:-60s}" \
	-phases "${FLEET_PHASES:-steady,stale,burst}" -timeout "${FLEET_TIMEOUT:-1h}" -writers "${FLEET_WRITERS:-32}" \
	-controller-args "${FLEET_ARGS:-}" -candidate-args "${FLEET_CANDIDATE_ARGS:-}"
