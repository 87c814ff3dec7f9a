#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# API write economy (issue 11, benchmark 3): the real agent and controller programs against a
# real API server in an isolated test cluster (needs root, like the cluster tests), 1 000
# endpoints of one resource as bulk pods (testkit/cluster, one network namespace); EndpointSlice
# and status writes per minute while stable, and writes per change and API requests per second
# under a flap storm. stdout gets the markdown section (bench/run.sh), progress goes to stderr.
# Results: development/BENCHMARKS.md.
#
#   bench/writes/run.sh     # 3 rounds of a 60 s stable window and a 30 s storm: about 6 min
#   WRITES_ROUNDS=1 WRITES_STABLE=20s WRITES_STORM=10s bench/writes/run.sh
#
# Knobs: WRITES_ROUNDS (3), WRITES_ENDPOINTS (1000), WRITES_FLAPPING (100), WRITES_STABLE (60s),
# WRITES_STORM (30s), WRITES_LOGS=1 (print the programs' logs at the end).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$root/images/agent" && go build -o "$tmp/agent" ./cmd/agent)
(cd "$root/images/controller" && go build -o "$tmp/controller" ./cmd/controller)
(cd "$root/bench/writes" && GOWORK=off go build -o "$tmp/writes" .)
"$tmp/writes" --agent "$tmp/agent" --controller "$tmp/controller" \
	--rounds "${WRITES_ROUNDS:-3}" --endpoints "${WRITES_ENDPOINTS:-1000}" --flapping "${WRITES_FLAPPING:-100}" \
	--stable "${WRITES_STABLE:-60s}" --storm "${WRITES_STORM:-30s}"
