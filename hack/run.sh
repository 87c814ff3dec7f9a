#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# `make run` after its checks: the Debian packages, the pinned tools, the demo program's build,
# then the demo (testkit/cmd/swh-run, development/RUN.md). Each step prints one line when it is
# done, with the time it took; a step still running after 2 s says what it is doing, and again
# every 15 s, so that a terminal is never silent for minutes (the program goes on the same way).
#
#   hack/run.sh [SWH-RUN FLAGS...]     as root; --nodes=real also builds the node tool groups,
#                                      --dataplane=cilium the cilium group
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# The tests' build configuration (hack/test.sh): after a `make test` the demo's build and the
# controller and agent builds it runs find the dependencies compiled already.
export CGO_ENABLED=0
[[ " ${GOFLAGS:-} " == *" -trimpath "* ]] || export GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath"

# took T0 sets $elapsed to the time since T0 (microseconds, from ${EPOCHREALTIME/./}) as the
# program's steps print it: 0.4s, 12.3s, 1m5s. No subshell: nothing to fork and reap.
took() {
	local now=${EPOCHREALTIME/./}
	local us=$((now - $1))
	if ((us >= 60000000)); then
		printf -v elapsed '%dm%ds' $((us / 60000000)) $((us / 1000000 % 60))
	else
		printf -v elapsed '%d.%ds' $((us / 1000000)) $((us / 100000 % 10))
	fi
}

# heartbeat DOING T0: after 2 s one line saying what the step does, then one every 15 s; it
# ends when killed (stop_heartbeat) or when this script is gone. Its ticks are 1 s sleeps, so
# nothing of it outlives it by more than a second.
heartbeat() {
	local n=0 elapsed
	while sleep 1; do
		kill -0 $$ 2>/dev/null || exit 0
		n=$((n + 1))
		if ((n == 2)); then
			echo "make run: $1 ..."
		elif ((n > 2 && (n - 2) % 15 == 0)); then
			took "$2"
			echo "make run: $1 ... ($elapsed so far)"
		fi
	done
}

# hb is the running step's heartbeat; stop_heartbeat ends it (also when Ctrl-C ends a step).
hb=
stop_heartbeat() {
	if [[ -n $hb ]]; then
		kill "$hb" 2>/dev/null || true
		wait "$hb" 2>/dev/null || true
		hb=
	fi
}

# step DOING DONE CMD...: runs CMD, then prints "DONE (time)"; on failure "DOING: failed".
step() {
	local doing=$1 done=$2 t0=${EPOCHREALTIME/./} rc=0 elapsed
	shift 2
	heartbeat "$doing" "$t0" &
	hb=$!
	"$@" || rc=$?
	stop_heartbeat
	took "$t0"
	if ((rc != 0)); then
		echo "make run: $doing: failed after $elapsed (exit status $rc)" >&2
		return "$rc"
	fi
	echo "make run: $done ($elapsed)"
}

# The tool groups and the packages the demo's flags need: real nodes a kubelet and containerd;
# the Cilium dataplane (make run DATAPLANE=cilium, where the branch that adds it is merged) the
# cilium group and hack/deps.sh --cilium.
groups=(kube)
deps_args=()
for a in "$@"; do
	case $a in
	--nodes=real) groups+=(node containerd) ;;
	--dataplane=cilium)
		groups+=(cilium)
		deps_args+=(--cilium)
		;;
	esac
done

bin_dir=$(mktemp -d "${TMPDIR:-/tmp}/swh-run-bin.XXXXXX")
# No EXIT trap: with one, bash 5.2 prints "wait_for: No record of process" for the commands
# that run after a heartbeat was killed. Every way out below cleans up itself.
cleanup() {
	stop_heartbeat
	rm -rf "$bin_dir"
}
# Ctrl-C during a step ends the step's heartbeat with it.
trap 'cleanup; exit 130' INT TERM
build() { (cd testkit && go build -o "$bin_dir/swh-run" ./cmd/swh-run); }
status=0
step "checking the Debian packages (hack/deps.sh)" "Debian packages present" hack/deps.sh "${deps_args[@]}" &&
	step "building the pinned tools: ${groups[*]} (tools/build.sh; minutes the first time on a machine, cached after)" \
		"pinned tools ready: ${groups[*]}" tools/build.sh "${groups[@]}" &&
	step "building the demo program (go build ./testkit/cmd/swh-run; a minute or two the first time, cached after)" \
		"built the demo program" build || status=$?
if ((status == 0)); then
	# The demo handles Ctrl-C itself (it stops everything and exits 0; development/RUN.md,
	# "Stopping"): here a signal only waits for it, so the demo's status is make's.
	trap ':' INT TERM
	"$bin_dir/swh-run" "$@" || status=$?
fi
cleanup
exit "$status"
