#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian packages the tests need, when they are missing and we are root.
# Without root it prints the exact command to run and fails.
#
#   hack/deps.sh            the packages of `make test`
#   hack/deps.sh --cilium   and clang-19 (`make test-cilium`: cilium-agent compiles its BPF
#                           datapath at run time and Cilium 1.20 documents clang >= 18.1), and a
#                           private iptables for cilium-agent only (below)
set -euo pipefail

cilium=false
case "${1:-}" in
--cilium) cilium=true ;;
"") ;;
*) echo "deps: unknown argument $1 (want --cilium or nothing)" >&2; exit 2 ;;
esac

missing=()
if $cilium; then
	command -v clang-19 >/dev/null 2>&1 || missing+=(clang-19)
	# The libraries of the private iptables below (the package itself is not installed).
	for lib in libip4tc2 libip6tc2 libxtables12 libnftnl11 libnetfilter-conntrack3 libnfnetlink0; do
		dpkg -s "$lib" >/dev/null 2>&1 || missing+=("$lib")
	done
fi
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
[[ -x /usr/lib/postgresql/15/bin/postgres && -x /usr/lib/postgresql/15/bin/initdb ]] || missing+=(postgresql-15)
# testkit/mariadb starts its own MariaDB servers (the MySQL probe's tests).
[[ -x /usr/sbin/mariadbd && -x /usr/bin/mariadb-install-db ]] || missing+=(mariadb-server)
command -v runuser >/dev/null 2>&1 || missing+=(util-linux)
# The TCP send/expect probe tests run real Redis servers (a primary and a replica).
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v unshare >/dev/null 2>&1 || missing+=(util-linux)
# testkit/cluster runs processes inside pod network namespaces with nsenter.
command -v nsenter >/dev/null 2>&1 || missing+=(util-linux)
# make test-race (called by .ci/run) builds with -race, which needs cgo and a C compiler.
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
# testkit/realnode's containerd runs its containers with Debian's runc (make test-nodes).
[[ -x /usr/sbin/runc ]] || missing+=(runc)

# A private iptables for cilium-agent (testkit/cluster/cilium.go puts it on the agent's PATH only):
# Cilium wants ip6tables for IPv6, but an iptables on the machine's PATH would make every kubelet
# of the real-node tests create its KUBE-IPTABLES-HINT / KUBE-KUBELET-CANARY chains in their
# cluster namespace, which their leftover check would then report. So the Debian package is
# unpacked into the tools cache, not installed.
if $cilium; then
	cache=${SWH_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/service-with-healthchecks}
	ver=$(apt-cache policy iptables | sed -n 's/^ *Candidate: *//p')
	dir="$cache/iptables-$ver"
	if [[ ! -x $dir/usr/sbin/xtables-nft-multi ]]; then
		echo "deps: unpacking iptables $ver into $dir (for cilium-agent only)" >&2
		tmp=$(mktemp -d)
		trap 'rm -rf "$tmp"' EXIT
		(cd "$tmp" && apt-get download -qq "iptables=$ver" 2>/dev/null)
		mkdir -p "$dir.tmp"
		dpkg -x "$tmp"/iptables_*.deb "$dir.tmp"
		rm -rf "$dir"
		mv "$dir.tmp" "$dir"
	fi
fi

if [[ ${#missing[@]} -eq 0 ]]; then
	exit 0
fi
# util-linux may be listed twice.
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
	echo "deps: missing packages: ${missing[*]}" >&2
	echo "deps: run as root: $cmd" >&2
	exit 1
fi
echo "deps: installing ${missing[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The Debian package starts a cluster of its own; the tests start their own servers.
if command -v pg_lsclusters >/dev/null 2>&1; then
	pg_lsclusters -h 2>/dev/null | while read -r ver name _; do
		pg_ctlcluster "$ver" "$name" stop 2>/dev/null || true
	done
fi
# The Debian redis-server package may start a server of its own (where policy-rc.d allows it);
# the tests start their own. Stop only the one the package started, by its pid file.
if [[ -s /run/redis/redis-server.pid ]]; then
	kill "$(cat /run/redis/redis-server.pid)" 2>/dev/null || true
fi
if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
	systemctl disable --now redis-server.service >/dev/null 2>&1 || true
fi
