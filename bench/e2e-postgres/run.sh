#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Measures end-to-end scenario 1 of issue 10 (tests/e2e/postgres, BenchmarkDBWriteSwitch): the
# real programs on the cluster harness, a PostgreSQL primary and replica in pods, db-write from
# docs/examples/; each round promotes the replica, stops the old primary and measures how long
# until every new connection through the ClusterIP reaches the new primary. Needs root and
# PostgreSQL 15 (make deps). Results go to development/BENCHMARKS-HISTORY.md ("End-to-end: PostgreSQL switch").
#
#   bench/e2e-postgres/run.sh            # ROUNDS=5 failovers
#   ROUNDS=3 bench/e2e-postgres/run.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
rounds="${ROUNDS:-5}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [[ $(id -u) -ne 0 ]]; then
	echo "bench/e2e-postgres: needs root (network namespaces, nftables): run as root" >&2
	exit 1
fi
# Raw lines go to stderr; stdout gets the markdown section that bench/run.sh collects.
(cd "$root/tests" && go test ./e2e/postgres/ -count=1 -run '^$' -bench DBWriteSwitch -benchtime "${rounds}x" -v) 2>&1 |
	grep -E 'db-write switch:|^BenchmarkDBWriteSwitch|^(ok|FAIL|PASS)' | tee "$tmp/out" >&2
line="$(grep -E '^BenchmarkDBWriteSwitch' "$tmp/out" | grep -E 'switch-s' || true)"
if [[ -z $line ]]; then
	echo "bench/e2e-postgres: the benchmark did not report (see above)" >&2
	exit 1
fi
metric() { awk -v u="$1" '{ for (i = 2; i <= NF; i++) if ($i == u) print $(i-1) }' <<<"$line"; }
echo "## End-to-end: PostgreSQL switch (bench/e2e-postgres)"
echo
echo "Median of $rounds failovers of db-write (docs/examples/db.yaml), times from the moment the old primary began to stop."
echo
echo "| switch (every new connection reaches the new primary) | routed (kube-proxy routes only to it) | decision bound (asserted at 3x) |"
echo "| ---: | ---: | ---: |"
echo "| $(metric switch-s) s | $(metric routed-s) s | $(metric bound-s) s |"
