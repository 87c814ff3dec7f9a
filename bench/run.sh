#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Runs every benchmark suite in a fixed order and prints one markdown report to stdout
# (`make bench`). Results worth keeping go to development/BENCHMARKS-HISTORY.md by hand, with the
# machine load; headline figures to the results table of development/BENCHMARKS.md.
#
# Contract for a suite (one folder per suite, bench/<suite>/run.sh):
#   - Order: probes, capacity, publish, writes, amplification, agentcache, scale, fleet, noisy-neighbour. A suite whose run.sh is
#     missing (or not executable) is skipped with a note; a folder with a run.sh that is not in
#     this list runs after them, in name order, so a new suite is never silently left out.
#   - The suite's run.sh is called with no arguments, from the repository root, with REPO_ROOT
#     set. It builds what it needs itself (test binaries, programs); the tools and Debian
#     packages are already there (`make bench` depends on `make deps tools`).
#   - stdout: the suite's markdown section and nothing else: a `## <title>` line, then lines of
#     text and/or a markdown table of results (medians of repeated rounds where it repeats).
#     Progress, raw benchmark lines and logs go to stderr.
#   - Exit status: non-zero when the suite could not measure (build failure, harness error);
#     it is reported in the table and the remaining suites still run. A benchmark is never a
#     pass/fail test: a missed goal is a number in the table, not a failure.
#   - Knobs are environment variables documented at the top of the suite's run.sh; a suite
#     should finish in a few minutes with its defaults on a 2-core machine.
#
#   bench/run.sh                              # every suite
#   BENCH_SUITES="capacity writes" bench/run.sh   # only these (still in the fixed order)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
export REPO_ROOT="$root"
order=(probes capacity publish writes amplification agentcache scale fleet noisy-neighbour)

# Suites that exist but are not in the fixed order run last, in name order.
for d in "$root"/bench/*/; do
	s="$(basename "$d")"
	[[ " ${order[*]} " == *" $s "* ]] || order+=("$s")
done
if [[ -n "${BENCH_SUITES:-}" ]]; then
	selected=()
	for s in "${order[@]}"; do
		[[ " $BENCH_SUITES " == *" $s "* ]] && selected+=("$s")
	done
	order=("${selected[@]}")
fi

echo "# Benchmarks ($(date -u '+%Y-%m-%d %H:%M UTC'))"
echo
echo "- machine: $(nproc) CPU ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) memory, kernel $(uname -r)"
echo "- $(go version | cut -d' ' -f3-), open-file limit $(ulimit -n)"
echo "- load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo

declare -A status
for s in "${order[@]}"; do
	script="$root/bench/$s/run.sh"
	if [[ ! -x "$script" ]]; then
		status[$s]="skipped (no bench/$s/run.sh)"
		continue
	fi
	echo "bench: running $s (load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
	start=$SECONDS
	(cd "$root" && "$script")
	rc=$?
	echo
	if [[ $rc -eq 0 ]]; then
		status[$s]="ok, $((SECONDS - start)) s"
	else
		status[$s]="FAILED (exit $rc) after $((SECONDS - start)) s"
	fi
done

echo "## Suites"
echo
echo "| suite | result |"
echo "| --- | --- |"
for s in "${order[@]}"; do
	echo "| $s | ${status[$s]} |"
done
echo
echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
fail=0
for s in "${order[@]}"; do
	[[ "${status[$s]}" == FAILED* ]] && fail=1
done
exit $fail
