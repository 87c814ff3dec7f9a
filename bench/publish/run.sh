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
#   POLICIES=0 bench/publish/run.sh               # without the chart's admission policies (the runs before 2026-12-04)
#   DATAPLANE=kube-proxy bench/publish/run.sh     # also up to kube-proxy's rules (nft monitor): the latency a client sees
#   DATAPLANE=cilium bench/publish/run.sh         # also up to Cilium's BPF service map (cilium-agent v1.20.2 as kube-proxy
#                                                 # replacement; polled every 1 ms): needs `hack/deps.sh --cilium` (clang-19)
#                                                 # and the cilium tool group (tools/build.sh cilium, ~15 min the first time)
#
# By default the chart's ValidatingAdmissionPolicies are installed (rendered with the default
# settings by tests/internal/cmd/renderchart) and the agent acts as its service account on its
# node, so that its slice writes pay the CEL they pay in a cluster.
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
policies=()
if [[ ${POLICIES:-1} != 0 ]]; then
	(cd "$root" && go run ./tests/internal/cmd/renderchart -kinds ValidatingAdmissionPolicy,ValidatingAdmissionPolicyBinding) >"$tmp/policies.yaml"
	policies=(-policies "$tmp/policies.yaml")
fi
# The cluster harness finds go.work (and the tool binaries) from the working directory.
cd "$root/bench/publish"
"$tmp/publish" -agent "$agent" ${DATAPLANE:+-dataplane "$DATAPLANE"} -sizes "${SIZES:-100,1000}" -samples "${SAMPLES:-100}" -rounds "${ROUNDS:-3}" "${policies[@]}" ${PUBLISH_ARGS:-}
