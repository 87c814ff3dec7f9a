#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Publish latency: builds the agent program and this benchmark, then measures, side by side on
# one API server, the agent (decisive probe → EndpointSlice watch event) and
# kube-controller-manager's EndpointSlice controller (the kubelet's status writes → watch event) with
# SIZES endpoints on a node. Needs root (network namespaces; the benchmark isolates itself like
# the testkit/cluster tests). Prints a markdown section (development/BENCHMARKS-HISTORY.md, "Publish latency")
# on stdout; progress goes to stderr.
#
#   bench/publish/run.sh                          # SIZES=100,1000 SAMPLES=100 ROUNDS=3
#   SIZES=100 SAMPLES=20 ROUNDS=1 bench/publish/run.sh
#   AGENT=/path/to/agent bench/publish/run.sh     # an agent built elsewhere
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [[ $(id -u) -ne 0 ]]; then
	echo "bench/publish needs root (network namespaces): sudo $0" >&2
	exit 1
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
agent="${AGENT:-$tmp/agent}"
[[ -n ${AGENT:-} ]] || (cd "$root" && go build -o "$agent" ./images/agent/cmd/agent)
(cd "$root/bench/publish" && GOWORK=off go build -o "$tmp/publish" .)
# The cluster harness finds go.work (and the tool binaries) from the working directory.
cd "$root/bench/publish"
"$tmp/publish" -agent "$agent" -sizes "${SIZES:-100,1000}" -samples "${SAMPLES:-100}" -rounds "${ROUNDS:-3}" ${PUBLISH_ARGS:-}
