#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Agent cost of other nodes (issue 19 part 1): builds the agent program and this benchmark, then,
# for each count of other nodes' EndpointSlices in a fresh kube-apiserver, starts the agent for
# one node and reports its RSS and its CPU time over a window in which some of those slices
# change. With AGENTCACHE_BASELINE=<git revision> it also builds the agent of that revision (in a
# temporary worktree) and alternates the two. Prints a markdown section
# (development/BENCHMARKS-HISTORY.md, "Agent cost of other nodes") on stdout; progress goes to stderr.
# No root needed. Heavy (50 000 slices): not part of `make test`.
#
#   bench/agentcache/run.sh                                   # counts 0,10000,50000, 3 rounds
#   AGENTCACHE_BASELINE=HEAD~5 AGENTCACHE_COUNTS=0,10000 AGENTCACHE_ROUNDS=1 bench/agentcache/run.sh
#
# Knobs: AGENTCACHE_COUNTS (0,10000,50000), AGENTCACHE_ROUNDS (3), AGENTCACHE_WINDOW (60s),
# AGENTCACHE_CHURN (50 updates/s), AGENTCACHE_BASELINE (a git revision; none).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
cleanup() {
	[[ -d $tmp/base ]] && git -C "$root" worktree remove --force "$tmp/base" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT
(cd "$root" && go build -o "$tmp/agent" ./images/agent/cmd/agent)
baseline=()
if [[ -n ${AGENTCACHE_BASELINE:-} ]]; then
	git -C "$root" worktree add --detach "$tmp/base" "$AGENTCACHE_BASELINE" >&2
	(cd "$tmp/base" && go build -o "$tmp/agent-base" ./images/agent/cmd/agent)
	baseline=(-baseline "$tmp/agent-base")
fi
(cd "$root/bench/agentcache" && GOWORK=off go build -o "$tmp/agentcache" .)
# The control plane finds go.work (and the tool binaries) from the working directory.
cd "$root/bench/agentcache"
"$tmp/agentcache" -agent "$tmp/agent" "${baseline[@]}" -counts "${AGENTCACHE_COUNTS:-0,10000,50000}" \
	-rounds "${AGENTCACHE_ROUNDS:-3}" -window "${AGENTCACHE_WINDOW:-60s}" -churn "${AGENTCACHE_CHURN:-50}"
