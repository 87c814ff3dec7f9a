#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Downloads the modules that building tool groups needs, and compiles nothing:
#
#   tools/fetch.sh GROUP...
#
# .ci/run fetches the later steps' groups (node, containerd, cilium, codegen, lint) while `make test`
# compiles, so their builds later find the module cache filled. A group already built
# (tools/build.sh's cache) is skipped. It lives apart from tools/build.sh because that script's
# text is part of every group's cache key.
set -euo pipefail

# As the Makefile exports it: module-sdk and oci-tools are served but missing from the checksum
# database.
export GONOSUMDB=${GONOSUMDB:-github.com/deckhouse,github.com/sylabs}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for g in "$@"; do
	[[ -f $here/$g/go.mod ]] || { echo "tools: unknown group $g" >&2; exit 2; }
	[[ ! -f $("$here/build.sh" --dir "$g")/.complete ]] || continue
	(
		cd "$here/$g"
		export GOWORK=off CGO_ENABLED=0
		flags=()
		if [[ -f build-flags ]]; then
			read -r -a flags <build-flags
		fi
		# The packages of the group's `tool` lines, as tools/build.sh reads them.
		mapfile -t pkgs < <(sed -n '/^tool (/,/^)/{/^tool (/d;/^)/d;p}; s/^tool \([^(].*\)$/\1/p' go.mod | tr -d '\t ')
		# go list reads the packages' imports, which downloads their modules.
		go list "${flags[@]}" -deps "${pkgs[@]}" >/dev/null
	)
done
