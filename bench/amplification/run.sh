#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Reconcile amplification (issue 19 part 2): the real agent program for one node against a real
# API server in an isolated test cluster (needs root, like the cluster tests), a few resources
# and bulk pods, no controller; counts the agent's reconciles (its own
# controller_runtime_reconcile_total) per cause: status writes with and without an ownership
# change, pod label changes on unselected and selected pods, spec edits, other nodes'
# EndpointSlice writes. stdout gets the markdown section (bench/run.sh), progress goes to
# stderr. Results: development/BENCHMARKS-HISTORY.md, "Reconcile amplification".
#
#   bench/amplification/run.sh                          # 10 events per phase: about 5 min
#   AMPLIFICATION_EVENTS=4 bench/amplification/run.sh   # a quick look
#
# Knobs: AMPLIFICATION_EVENTS (10 per phase), AMPLIFICATION_RESOURCES (3), AMPLIFICATION_PODS
# (3 per resource), AMPLIFICATION_QUIET (2s: the counter is flat when it has not moved for this
# long), AMPLIFICATION_LOGS=1 (print the agent's log at the end).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$root/images/agent" && go build -o "$tmp/agent" ./cmd/agent)
(cd "$root/bench/amplification" && GOWORK=off go build -o "$tmp/amplification" .)
logs=()
[[ ${AMPLIFICATION_LOGS:-} == 1 ]] && logs=(--logs)
# The control plane finds go.work (and the tool binaries) from the working directory.
cd "$root/bench/amplification"
"$tmp/amplification" --agent "$tmp/agent" --events "${AMPLIFICATION_EVENTS:-10}" \
	--resources "${AMPLIFICATION_RESOURCES:-3}" --pods "${AMPLIFICATION_PODS:-3}" \
	--quiet "${AMPLIFICATION_QUIET:-2s}" "${logs[@]}"
