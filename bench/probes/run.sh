#!/usr/bin/env bash
# Runs the probe benchmarks of the agent (images/agent/internal/prober: TCP, HTTP, PostgreSQL)
# and of the kubelet (this module: k8s.io/kubernetes/pkg/probe/{tcp,http}) in one go, against
# the same kind of local servers. Results go to docs/BENCHMARKS.md. Needs PostgreSQL 15
# (make deps) and, as root, runs it as the postgres user.
#
#   bench/probes/run.sh                 # default: -benchtime=3s -count=3
#   BENCH_FLAGS="-benchtime=1000x" bench/probes/run.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
flags=(${BENCH_FLAGS:--benchtime=3s -count=3})
echo "== agent prober (images/agent/internal/prober)"
(cd "$root/images/agent" && go test -run '^$' -bench . -benchmem "${flags[@]}" ./internal/prober/)
echo "== kubelet prober (bench/probes, k8s.io/kubernetes v1.37.2)"
(cd "$root/bench/probes" && GOWORK=off go test -run '^$' -bench . -benchmem "${flags[@]}" .)
