#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Runs the probe benchmarks of the agent (images/agent/internal/prober: TCP, HTTP, PostgreSQL, gRPC)
# and of the kubelet (this module: k8s.io/kubernetes/pkg/probe/{tcp,http,grpc}) against the same kind
# of local servers. Both test binaries are built first and then run in alternation, ROUNDS times,
# so load from anything else on the machine hits both sides alike. Results go to
# development/BENCHMARKS.md. Needs PostgreSQL 15 (make deps); as root it runs it as the postgres user.
#
#   bench/probes/run.sh                                   # ROUNDS=5 BENCHTIME=2s
#   ROUNDS=3 BENCHTIME=1000x BENCH='TCP|HTTP' bench/probes/run.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
rounds="${ROUNDS:-5}"
benchtime="${BENCHTIME:-2s}"
bench="${BENCH:-.}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$root/images/agent" && go test -c -o "$tmp/agent.test" ./internal/prober/)
(cd "$root/bench/probes" && GOWORK=off go test -c -o "$tmp/kubelet.test" .)
flags=(-test.run '^$' -test.bench "$bench" -test.benchmem -test.benchtime "$benchtime")
# Raw lines go to stderr; stdout gets the markdown section that bench/run.sh collects.
for i in $(seq 1 "$rounds"); do
	echo "== round $i: agent prober (images/agent/internal/prober)" >&2
	(cd "$root/images/agent/internal/prober" && "$tmp/agent.test" "${flags[@]}") | grep -E '^Benchmark' | sed 's/^/ours /' | tee -a "$tmp/results" >&2
	echo "== round $i: kubelet prober (k8s.io/kubernetes v1.37.2 pkg/probe)" >&2
	(cd "$root/bench/probes" && "$tmp/kubelet.test" "${flags[@]}") | grep -E '^Benchmark' | sed 's/^/kubelet /' | tee -a "$tmp/results" >&2
done
echo "## Probers: ours against the kubelet's (bench/probes)"
echo
echo "Median of $rounds rounds, -benchtime $benchtime, one probe per operation against a loopback server."
echo
echo "| prober | benchmark | ns/op | B/op | allocs/op |"
echo "| --- | --- | ---: | ---: | ---: |"
for key in $(awk '{print $1 "/" $2}' "$tmp/results" | sort -u); do
	side="${key%%/*}" name="${key#*/}"
	med() { awk -v s="$side" -v n="$name" -v u="$1" '$1 == s && $2 == n { for (i = 3; i < NF; i++) if ($(i+1) == u) print $i }' "$tmp/results" | sort -g | awk '{v[NR] = $1} END {if (NR) print v[int((NR+1)/2)]; else print "-"}'; }
	echo "| $side | ${name%-*} | $(med ns/op) | $(med B/op) | $(med allocs/op) |"
done
