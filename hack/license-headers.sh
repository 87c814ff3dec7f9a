#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Adds the project's license header to the Go and shell sources that lack one, or checks that
# none lacks it (development/PACKAGING.md, "Licence and headers").
#
#   hack/license-headers.sh            add the header where it is missing (idempotent)
#   hack/license-headers.sh --check    list the files without it and exit 1 if there are any
#
# The header names no company: the code is ours, under the Apache License 2.0 in LICENSE.
#   Go:    // Copyright The service-with-healthchecks Authors.
#          // SPDX-License-Identifier: Apache-2.0
#   shell: the same lines with "#", after the "#!" line.
# Skipped: generated files ("Code generated ... DO NOT EDIT." near the top), testdata/ folders,
# .ci/ (CI's entry point, not a source of the product) and tools/build.sh (its bytes key every
# tools cache folder: a header would rebuild every pinned tool on every machine).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
holder="The service-with-healthchecks Authors."
spdx="SPDX-License-Identifier: Apache-2.0"

check=false
case "${1:-}" in
--check) check=true ;;
"") ;;
-h|--help) sed -n '4,16p' "$0"; exit 0 ;;
*) echo "license-headers: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac

# has_header FILE: the SPDX line is among the first lines.
has_header() { head -n 5 "$1" | grep -qF "$spdx"; }
# generated FILE: the Go convention for generated code, near the top.
generated() { head -n 10 "$1" | grep -qE '^// Code generated .* DO NOT EDIT\.$'; }

add_go() {
	local f=$1 tmp
	tmp=$(mktemp "$f.XXXXXX")
	{ printf '// Copyright %s\n// %s\n\n' "$holder" "$spdx"; cat "$f"; } >"$tmp"
	chmod --reference="$f" "$tmp"
	mv "$tmp" "$f"
}

add_shell() {
	local f=$1 tmp
	tmp=$(mktemp "$f.XXXXXX")
	if head -n 1 "$f" | grep -q '^#!'; then
		{ head -n 1 "$f"; printf '# Copyright %s\n# %s\n' "$holder" "$spdx"; tail -n +2 "$f"; } >"$tmp"
	else
		{ printf '# Copyright %s\n# %s\n\n' "$holder" "$spdx"; cat "$f"; } >"$tmp"
	fi
	chmod --reference="$f" "$tmp"
	mv "$tmp" "$f"
}

missing=()
cd "$root"
while IFS= read -r -d '' f; do
	case "$f" in
	.ci/* | */testdata/* | testdata/* | tools/build.sh) continue ;;
	esac
	[[ -s $f ]] || continue
	has_header "$f" && continue
	case "$f" in
	*.go) generated "$f" && continue ;;
	esac
	if $check; then
		missing+=("$f")
		continue
	fi
	case "$f" in
	*.go) add_go "$f" ;;
	*.sh) add_shell "$f" ;;
	esac
	echo "license-headers: added to $f"
done < <(git ls-files -z --cached --others --exclude-standard -- '*.go' '*.sh')

if $check && [[ ${#missing[@]} -gt 0 ]]; then
	printf 'license-headers: no license header in:\n' >&2
	printf '  %s\n' "${missing[@]}" >&2
	echo "license-headers: ${#missing[@]} file(s); run hack/license-headers.sh to add it" >&2
	exit 1
fi
