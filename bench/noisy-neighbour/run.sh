#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Noisy neighbour (issue 16, part 2): one namespace's probes cannot delay another's. In one
# namespace NOISY_HANGING HTTP probes against servers that accept and never answer
# (timeoutSeconds 60), in another NOISY_NORMAL pods probed over HTTP every second; one agent with
# the default pool of 64 workers, the real prober, a real API server (BenchmarkNoisyNeighbour in
# images/agent/internal/agent, root: network namespaces). Reported: the normal probes'
# scheduling lag (start - due) while the hanging probes hold their workers, and their failure
# detection time (a pod's server starts failing -> a watch sees its endpoint not ready). Each
# round is a fresh process; stdout gets the medians of the rounds as a markdown section
# (bench/run.sh), raw benchmark lines go to stderr. Results: development/BENCHMARKS.md.
#
#   bench/noisy-neighbour/run.sh          # 3 rounds x (30 s window + 10 detections): about 5 min
#   NOISY_ROUNDS=1 NOISY_HANGING=8 NOISY_NORMAL=5 NOISY_DURATION=3s NOISY_SAMPLES=1 bench/noisy-neighbour/run.sh
#
# Knobs: NOISY_ROUNDS (3), NOISY_HANGING (96), NOISY_NORMAL (100), NOISY_DURATION (30s, the lag
# window), NOISY_SAMPLES (10 detections per round). TEST_BINARY: a test binary of
# ./images/agent/internal/agent built elsewhere.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [[ $(id -u) -ne 0 ]]; then
	echo "bench/noisy-neighbour needs root (network namespaces): sudo $0" >&2
	exit 1
fi
rounds="${NOISY_ROUNDS:-3}"
export NOISY_HANGING="${NOISY_HANGING:-96}" NOISY_NORMAL="${NOISY_NORMAL:-100}"
export NOISY_DURATION="${NOISY_DURATION:-30s}" NOISY_SAMPLES="${NOISY_SAMPLES:-10}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
bin="${TEST_BINARY:-$tmp/agent.test}"
[[ -n ${TEST_BINARY:-} ]] || (cd "$root/images/agent" && go test -c -o "$bin" ./internal/agent/)
# The cluster harness finds go.work (and the tool binaries) from the working directory.
cd "$root/images/agent/internal/agent"
touch "$tmp/results"
for i in $(seq 1 "$rounds"); do
	echo "== round $i: $NOISY_HANGING hanging, $NOISY_NORMAL normal probes" >&2
	line="$("$bin" -test.run '^$' -test.bench '^BenchmarkNoisyNeighbour$' -test.benchtime 1x | grep -E '^BenchmarkNoisyNeighbour' || true)"
	echo "$line (load $(cut -d' ' -f1 /proc/loadavg))" >&2
	if [[ -z "$line" ]]; then
		echo "bench/noisy-neighbour: round $i measured nothing" >&2
		exit 1
	fi
	echo "$line" >>"$tmp/results"
done

# med <unit>: the median over the rounds of a reported metric.
med() {
	awk -v u="$1" '{ for (i = 2; i < NF; i++) if ($(i+1) == u) print $i }' "$tmp/results" |
		sort -g | awk '{v[NR] = $1} END {if (NR) printf "%.4g", v[int((NR+1)/2)]; else print "-"}'
}
echo "## Noisy neighbour (bench/noisy-neighbour)"
echo
echo "$NOISY_HANGING HTTP probes that never get an answer (timeoutSeconds 60) in one namespace, $NOISY_NORMAL pods"
echo "probed over HTTP every second (timeoutSeconds 1, failureThreshold 3) in another; one agent, 64 workers."
echo "Lag: start - due of the normal probes over $NOISY_DURATION once the hanging probes hold their workers;"
echo "detection: a normal pod's server fails -> a watch sees its endpoint not ready ($NOISY_SAMPLES per round)."
echo "Medians of $rounds rounds, each in a fresh process. Goals: lag p99 < 100 ms, detection <= $(med detect-goal-s) s."
echo
echo "| hanging in flight | late runs | normal runs/s | lag p50 ms | lag p99 ms | lag max ms | detection p50 s | detection max s | goal s |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
echo "| $(med hanging-in-flight) | $(med late-runs) | $(med normal-runs/s) | $(med lag-p50-ms) | $(med lag-p99-ms) | $(med lag-max-ms) | $(med detect-p50-s) | $(med detect-max-s) | $(med detect-goal-s) |"
