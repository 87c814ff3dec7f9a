#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Builds the module's programs as static binaries (CGO_ENABLED=0, trimmed paths), the way the
# images are built: werf's images/*/werf.inc.yaml run this script, and CI runs it through
# `make build`. Each program builds alone (GOWORK=off), like in its image.
#
#   hack/build-images.sh [--out DIR] [controller|agent|hooks ...]
#
# Without names it builds every program. A program whose main package does not exist yet is
# skipped with a message (so the bundle builds while programs are being written).
#
# The controller and the agent are stamped with -ldflags -X (lib/version; --version, *_build_info):
# the version is $SWH_VERSION, else Chart.yaml's appVersion (the newest release recorded in
# CHANGELOG.md), else "dev"; the revision is $SWH_REVISION, else the git commit of the checkout,
# else "unknown" (development/RELEASING.md).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="$root/bin"
names=()
while [[ $# -gt 0 ]]; do
	case "$1" in
	--out) out=$2; shift 2 ;;
	--out=*) out=${1#--out=}; shift ;;
	-h|--help) sed -n '2,10p' "$0"; exit 0 ;;
	*) names+=("$1"); shift ;;
	esac
done
[[ ${#names[@]} -gt 0 ]] || names=(controller agent hooks)

# name -> module folder and main package inside it.
module_of() {
	case "$1" in
	controller) echo "images/controller ./cmd/controller" ;;
	agent) echo "images/agent ./cmd/agent" ;;
	hooks) echo "hooks ." ;;
	*) echo "build-images: unknown program $1 (known: controller agent hooks)" >&2; return 1 ;;
	esac
}

version=${SWH_VERSION:-}
if [[ -z $version && -f "$root/Chart.yaml" ]]; then
	version=$(sed -n 's/^appVersion:[[:space:]]*"\{0,1\}\([^"[:space:]]*\)"\{0,1\}[[:space:]]*$/\1/p' "$root/Chart.yaml")
fi
version=${version:-dev}
revision=${SWH_REVISION:-$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || true)}
revision=${revision:-unknown}
stamp="-X github.com/deckhouse/service-with-healthchecks/lib/version.Version=$version"
stamp+=" -X github.com/deckhouse/service-with-healthchecks/lib/version.Revision=$revision"

mkdir -p "$out"
out=$(cd "$out" && pwd)
for name in "${names[@]}"; do
	read -r dir pkg < <(module_of "$name")
	if ! ls "$root/$dir/${pkg#./}"/*.go >/dev/null 2>&1; then
		echo "build-images: skipping $name: $dir/${pkg#./} has no Go files yet" >&2
		continue
	fi
	echo "build-images: $name $version ($revision) -> $out/$name" >&2
	(cd "$root/$dir" && GOWORK=off CGO_ENABLED=0 go build -trimpath -ldflags="-s -w $stamp" -o "$out/$name" "$pkg")
done
