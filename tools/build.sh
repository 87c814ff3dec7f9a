#!/usr/bin/env bash
# Builds the pinned tools from the Go module proxy and caches them outside the checkout.
#
#   tools/build.sh [GROUP...]        build the groups (default: all) and print nothing else
#   tools/build.sh --dir GROUP       print the cache folder of GROUP (built or not)
#
# Each group is a Go module under tools/<group> (outside go.work) whose `tool` lines name the
# binaries. A group's folder is keyed by a digest of its go.mod, go.sum, this script and the Go
# version, so a fresh clone on the same machine reuses the binaries and a version change rebuilds
# them. The cache root is $SWH_TOOLS_CACHE or $HOME/.cache/service-with-healthchecks.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache_root=${SWH_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/service-with-healthchecks}
all_groups=(kube codegen lint)

group_dir() {
	local g=$1 key
	key=$( (
		go env GOVERSION
		cat "$here/$g/go.mod" "$here/$g/go.sum" "$here/build.sh"
		if [[ -f $here/$g/build-flags ]]; then cat "$here/$g/build-flags"; fi
	) | sha256sum | cut -c1-16)
	echo "$cache_root/$g-$key"
}

# Binary names for packages whose last path element is a major version (go.etcd.io/etcd/server/v3).
bin_name() {
	case $1 in
	go.etcd.io/etcd/server/v3) echo etcd ;;
	*) basename "$1" ;;
	esac
}

# The file name `go build -o DIR/` gives a main package: its last element, or the one before a
# major-version element (go.etcd.io/etcd/server/v3 -> server).
go_name() {
	local base=${1##*/}
	if [[ $base =~ ^v[0-9]+$ ]]; then
		base=${1%/*}
		base=${base##*/}
	fi
	echo "$base"
}

build_group() {
	local g=$1 dir tmp pkg
	dir=$(group_dir "$g")
	if [[ -f $dir/.complete ]]; then
		return 0
	fi
	# One build of a group at a time: hack/test.sh builds kube-rbac-proxy beside the first tests,
	# and the test that needs it calls this script, which waits here and then finds it built.
	mkdir -p "$cache_root"
	local lock
	exec {lock}>"$cache_root/.$g.lock"
	flock "$lock"
	if [[ -f $dir/.complete ]]; then
		exec {lock}>&-
		return 0
	fi
	echo "tools: building $g into $dir (first time on this machine; minutes)" >&2
	tmp=$(mktemp -d "$cache_root/.$g.XXXXXX")
	trap 'rm -rf "$tmp"' RETURN
	(
		cd "$here/$g"
		export GOWORK=off
		# The tests' build configuration (hack/test.sh): with the same flags and the same module
		# versions (tests/internal/cmd/toolversions keeps them so) the packages the tools and the
		# test binaries share (client-go, apimachinery, gRPC, protobuf, golang.org/x) are compiled
		# once on a fresh machine. Every tool here is a static binary upstream too.
		export CGO_ENABLED=0
		[[ " ${GOFLAGS:-} " == *" -trimpath "* ]] || export GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath"
		# Extra build flags of the group (tools/<group>/build-flags), e.g. promtool's build tag
		# remove_all_sd: without it promtool links the service discovery of every cloud.
		local -a flags=()
		if [[ -f build-flags ]]; then
			read -r -a flags <build-flags
		fi
		mapfile -t pkgs < <(sed -n '/^tool (/,/^)/{/^tool (/d;/^)/d;p}; s/^tool \([^(].*\)$/\1/p' go.mod | tr -d '\t ')
		echo "tools:   ${pkgs[*]}" >&2
		# One invocation for the whole group: the compiler shares the packages the binaries have in
		# common and links them in parallel. No DWARF (-s -w): nobody debugs these tools, and the
		# linker spends a large share of a cold build writing it for the k8s binaries.
		go build "${flags[@]}" -ldflags='-s -w' -o "$tmp/bin/" "${pkgs[@]}"
		for pkg in "${pkgs[@]}"; do
			mv "$tmp/bin/$(go_name "$pkg")" "$tmp/$(bin_name "$pkg")"
		done
		rmdir "$tmp/bin"
	)
	touch "$tmp/.complete"
	rm -rf "$dir"
	mv "$tmp" "$dir"
	exec {lock}>&-
}

if [[ ${1:-} == --dir ]]; then
	group_dir "${2:?--dir needs a group: ${all_groups[*]}}"
	exit 0
fi

groups=("$@")
[[ ${#groups[@]} -gt 0 ]] || groups=("${all_groups[@]}")
for g in "${groups[@]}"; do
	[[ -f $here/$g/go.mod ]] || { echo "tools: unknown group $g (have: ${all_groups[*]})" >&2; exit 2; }
	build_group "$g"
done
