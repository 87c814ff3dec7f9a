#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Controller scale: builds the controller program and this benchmark, then creates RESOURCES
# ServiceWithHealthchecks at once against a fresh kube-apiserver (--service-cluster-ip-range a
# /16) ROUNDS times, with a fresh controller process each round. Prints a markdown section
# (development/BENCHMARKS-HISTORY.md, "Controller scale") on stdout; progress goes to stderr. No root needed.
#
#   bench/scale/run.sh                          # RESOURCES=1000 ROUNDS=3
#   RESOURCES=200 ROUNDS=1 bench/scale/run.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# CONTROLLER=<path> runs an already built controller instead.
controller="${CONTROLLER:-$tmp/controller}"
[[ -n ${CONTROLLER:-} ]] || (cd "$root" && go build -o "$controller" ./images/controller/cmd/controller)
(cd "$root/bench/scale" && GOWORK=off go build -o "$tmp/scale" .)
# The control plane finds go.work (and the tool binaries) from the working directory.
cd "$root/bench/scale"
"$tmp/scale" -controller "$controller" -resources "${RESOURCES:-1000}" -rounds "${ROUNDS:-3}" ${SCALE_ARGS:-}
