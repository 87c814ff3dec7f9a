#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Probe capacity of one agent (issue 11, benchmark 1; the floor: issue 19, part 7): n targets
# with a 1 s period, TCP and HTTP, probed by the agent's scheduler and prober (BenchmarkCapacity
# in images/agent/internal/scheduler), for the ratios by the kubelet's own probe code driven the
# kubelet's way (BenchmarkKubeletCapacity, this module), and by the floor: one thread making only
# the system calls a probe needs (BenchmarkFloorCapacity, this module). The targets are
# listeners of ./server, a process of its own, so the CPU time and peak RSS are the prober's
# alone. Every case runs in a fresh process (peak RSS is a high-water mark), the probers in
# alternation, CAPACITY_ROUNDS times; stdout gets the medians as a markdown section
# (bench/run.sh), raw benchmark lines go to stderr. Results and the columns:
# development/BENCHMARKS-HISTORY.md, "Probe capacity".
#
#   bench/capacity/run.sh       # 3 rounds x {tcp,http} x {1000,5000,10000} x {agent,kubelet,floor}: about 24 min
#   CAPACITY_ROUNDS=1 CAPACITY_SIZES=10000 CAPACITY_MODES=tcp CAPACITY_KUBELET=0 bench/capacity/run.sh
#
# Knobs: CAPACITY_ROUNDS (3), CAPACITY_SIZES ("1000 5000 10000"), CAPACITY_MODES ("tcp http"),
# CAPACITY_KUBELET (1: also run the kubelet's prober), CAPACITY_FLOOR (1: also run the floor),
# SWH_CAPACITY_WARMUP (5s), SWH_CAPACITY_DURATION (20s, the measured window after the warm-up).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
rounds="${CAPACITY_ROUNDS:-3}"
sizes="${CAPACITY_SIZES:-1000 5000 10000}"
modes="${CAPACITY_MODES:-tcp http}"
kubelet="${CAPACITY_KUBELET:-1}"
floor="${CAPACITY_FLOOR:-1}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

(cd "$root/bench/capacity" && GOWORK=off go build -o "$tmp/server" ./server)
(cd "$root/images/agent" && go test -c -o "$tmp/agent.test" ./internal/scheduler/)
if [[ "$kubelet" == 1 || "$floor" == 1 ]]; then
	# One test binary holds the kubelet's prober and the floor.
	(cd "$root/bench/capacity" && GOWORK=off go test -c -o "$tmp/kubelet.test" .)
fi
export SWH_CAPACITY_SERVER="$tmp/server"

bench() { # bench <impl> <binary> <benchmark regexp>
	local line
	line="$("$2" -test.run '^$' -test.bench "$3" -test.benchtime 1x | grep -E '^Benchmark' || true)"
	echo "$1 $line (load $(cut -d' ' -f1 /proc/loadavg))" >&2
	[[ -n "$line" ]] && echo "$1 $line" >>"$tmp/results"
}
for i in $(seq 1 "$rounds"); do
	for mode in $modes; do
		for n in $sizes; do
			echo "== round $i: $mode $n targets" >&2
			bench agent "$tmp/agent.test" "Capacity/$mode/$n\$"
			if [[ "$kubelet" == 1 ]]; then
				bench kubelet "$tmp/kubelet.test" "KubeletCapacity/$mode/$n\$"
			fi
			if [[ "$floor" == 1 ]]; then
				bench floor "$tmp/kubelet.test" "FloorCapacity/$mode/$n\$"
			fi
		done
	done
done

# med <impl> <mode> <n> <unit>: the median of a reported metric.
med() {
	awk -v impl="$1" -v name="/$2/$3-" -v u="$4" '$1 == impl && index($2, name) { for (i = 3; i < NF; i++) if ($(i+1) == u) print $i }' "$tmp/results" |
		sort -g | awk '{v[NR] = $1} END {if (!NR) {print "-"; exit} m = v[int((NR+1)/2)]; if (m == int(m)) printf "%d", m; else printf "%.4g", m}'
}
# ratio <a> <b>: a / b with two decimals, "-" when either is missing.
ratio() {
	awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'
}
echo "## Probe capacity of one agent (bench/capacity)"
echo
echo "Targets with a 1 s period against loopback listeners in another process; medians of $rounds rounds,"
echo "each case in a fresh process: ${SWH_CAPACITY_WARMUP:-5s} warm-up, then ${SWH_CAPACITY_DURATION:-20s} measured."
echo "CPU is the prober process's user+system time per second of wall time, split into user (our code, Go's"
echo "runtime) and kernel (syscalls and, on loopback, the TCP work of both ends); × floor and × kubelet divide"
echo "the CPU per probe by the floor's and the kubelet's in the same run (the floor: one thread making only the"
echo "system calls a probe needs). Lag is how late a probe started against its plan. Goal: 10 000 TCP targets,"
echo "p99 lag < 100 ms, < 0.5 core, < 150 MiB; user µs per TCP probe half of the 27 µs measured before issue 19."
echo
echo "| mode | targets | prober | probes/s | CPU cores | CPU µs/probe | user µs/probe | kernel µs/probe | kernel % | × floor | × kubelet | peak RSS MiB | lag p50 ms | lag p99 ms | failures/s |"
echo "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
impls=(agent)
[[ "$kubelet" == 1 ]] && impls+=(kubelet)
[[ "$floor" == 1 ]] && impls+=(floor)
for mode in $modes; do
	for n in $sizes; do
		floorCPU="$(med floor "$mode" "$n" cpu-µs/probe)"
		kubeletCPU="$(med kubelet "$mode" "$n" cpu-µs/probe)"
		for impl in "${impls[@]}"; do
			cpu="$(med "$impl" "$mode" "$n" cpu-µs/probe)"
			echo "| $mode | $n | $impl | $(med "$impl" "$mode" "$n" probes/s) | $(med "$impl" "$mode" "$n" cpu-cores) | $cpu | $(med "$impl" "$mode" "$n" user-µs/probe) | $(med "$impl" "$mode" "$n" sys-µs/probe) | $(med "$impl" "$mode" "$n" sys-%) | $(ratio "$cpu" "$floorCPU") | $(ratio "$cpu" "$kubeletCPU") | $(med "$impl" "$mode" "$n" peak-RSS-MiB) | $(med "$impl" "$mode" "$n" lag-p50-ms) | $(med "$impl" "$mode" "$n" lag-p99-ms) | $(med "$impl" "$mode" "$n" failures/s) |"
		done
	done
done
