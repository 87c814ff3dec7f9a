#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Probe budget (issue 28, part 5): one namespace asks one node for BUDGET_PODS pods x
# BUDGET_RESOURCES resources x 32 TCP probes (102,400 targets by default, every BUDGET_PERIOD),
# a victim namespace for one HTTP probe every second; one agent with the real prober and a real
# API server (BenchmarkBudget in images/agent/internal/agent, root: network namespaces).
# Reported: the victim's scheduling lag (start - due) over BUDGET_DURATION, the targets asked
# for, probed and over budget, and the process's peak RSS and Go heap in use (the test's pod
# servers run in the same process: upper bounds of the agent's). Each round is a fresh
# process, with the default budget and, as the anchor, with none (BUDGET_ANCHOR=0 skips it);
# stdout gets the medians as a markdown section (bench/run.sh), raw benchmark lines go to
# stderr. Results: development/BENCHMARKS.md.
#
#   bench/probe-budget/run.sh        # 1 round x (budget, no budget) x 100 s: about 5 min
#   BUDGET_ROUNDS=3 BUDGET_DURATION=30s BUDGET_ANCHOR=0 bench/probe-budget/run.sh
#
# Knobs: BUDGET_ROUNDS (1), BUDGET_DURATION (100s), BUDGET_PODS (100), BUDGET_RESOURCES (32),
# BUDGET_PERIOD (10s, the hog's period), BUDGET_MAX (the agent's default budget),
# BUDGET_ANCHOR (1: also run without a budget). TEST_BINARY: a test binary of
# ./images/agent/internal/agent built elsewhere.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [[ $(id -u) -ne 0 ]]; then
	echo "bench/probe-budget needs root (network namespaces): sudo $0" >&2
	exit 1
fi
rounds="${BUDGET_ROUNDS:-1}"
anchor="${BUDGET_ANCHOR:-1}"
export BUDGET_DURATION="${BUDGET_DURATION:-100s}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
bin="${TEST_BINARY:-$tmp/agent.test}"
[[ -n ${TEST_BINARY:-} ]] || (cd "$root/images/agent" && go test -c -o "$bin" ./internal/agent/)
# The cluster harness finds go.work (and the tool binaries) from the working directory.
cd "$root/images/agent/internal/agent"
touch "$tmp/budget" "$tmp/none"
for i in $(seq 1 "$rounds"); do
	for kind in budget none; do
		[[ $kind == none && $anchor != 1 ]] && continue
		echo "== round $i: $kind" >&2
		max="${BUDGET_MAX:-}"
		[[ $kind == none ]] && max=none
		line="$(BUDGET_MAX="$max" "$bin" -test.run '^$' -test.bench '^BenchmarkBudget$' -test.benchtime 1x | grep -E '^BenchmarkBudget' || true)"
		echo "$line (load $(cut -d' ' -f1 /proc/loadavg))" >&2
		if [[ -z "$line" ]]; then
			echo "bench/probe-budget: round $i ($kind) measured nothing" >&2
			exit 1
		fi
		echo "$line" >>"$tmp/$kind"
	done
done

# med <file> <unit>: the median over the rounds of a reported metric.
med() {
	awk -v u="$2" '{ for (i = 2; i < NF; i++) if ($(i+1) == u) print $i }' "$tmp/$1" |
		sort -g | awk '{v[NR] = $1} END {if (NR) printf "%.4g", v[int((NR+1)/2)]; else print "-"}'
}
row() {
	echo "| $2 | $(med "$1" targets-asked) | $(med "$1" targets-probed) | $(med "$1" targets-over-budget) | $(med "$1" victim-runs/s) | $(med "$1" victim-lag-p50-ms) | $(med "$1" victim-lag-p99-ms) | $(med "$1" victim-lag-max-ms) | $(med "$1" heap-inuse-MiB) | $(med "$1" peak-rss-MiB) |"
}
echo "## Probe budget (bench/probe-budget)"
echo
echo "One namespace asks one node for ${BUDGET_PODS:-100} pods x ${BUDGET_RESOURCES:-32} resources x 32 TCP probes"
echo "every ${BUDGET_PERIOD:-10s}, a victim namespace for one HTTP probe every second; one agent, 64 workers."
echo "Lag: start - due of the victim's probe over $BUDGET_DURATION. Memory: the whole test process"
echo "(the agent and the test's pod servers). Medians of $rounds rounds, each in a fresh process."
echo
echo "| agent | asked | probed | over budget | victim runs/s | lag p50 ms | lag p99 ms | lag max ms | heap in use MiB | peak RSS MiB |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
row budget "budget ${BUDGET_MAX:-default}"
[[ $anchor == 1 ]] && row none "no budget"
exit 0
