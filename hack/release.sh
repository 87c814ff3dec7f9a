#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Cuts a release (development/RELEASING.md): `make release VERSION=x.y.z` runs it.
#
#   hack/release.sh [--tag] x.y.z
#
# Checks that the tree is clean, that x.y.z is a semantic version greater than the newest one
# recorded in CHANGELOG.md and that the Unreleased section has entries; then turns Unreleased into
# "## vx.y.z" with "Commit: <HEAD>" (the commit the release is cut from), opens an empty
# Unreleased above it, bumps Chart.yaml's version and appVersion, writes changelog.yaml (what
# Deckhouse reads from the release image) from the new section, and commits. --tag also tags the
# commit vx.y.z (welcome, not relied on: CHANGELOG.md is the record).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tag=false
[[ ${1:-} == --tag ]] && { tag=true; shift; }
version=${1:-}
die() { echo "release: $*" >&2; exit 1; }

[[ $version =~ ^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$ ]] ||
	die "VERSION=\"$version\": want a semantic version x.y.z without the v (e.g. 0.2.0)"
[[ -z $(git status --porcelain) ]] || die "the working tree is not clean: commit or stash first"
newest=$(sed -n 's/^## v\([0-9][0-9.]*\)$/\1/p' CHANGELOG.md | head -n1)
[[ -n $newest ]] || die "CHANGELOG.md records no release"
[[ $(printf '%s\n%s\n' "$newest" "$version" | sort -V | tail -n1) == "$version" && $newest != "$version" ]] ||
	die "$version is not greater than the newest recorded release $newest"
grep -q '^## Unreleased$' CHANGELOG.md || die "CHANGELOG.md has no '## Unreleased' section"
entries=$(awk '/^## Unreleased$/ {on=1; next} /^## / {on=0} on && /^- /' CHANGELOG.md | wc -l)
[[ $entries -gt 0 ]] || die "the Unreleased section has no entries"

commit=$(git rev-parse --short=7 HEAD)
awk -v v="$version" -v c="$commit" '
	/^## Unreleased$/ { print; print ""; print "## v" v; print ""; print "Commit: `" c "`"; next }
	{ print }' CHANGELOG.md > CHANGELOG.md.tmp && mv CHANGELOG.md.tmp CHANGELOG.md
sed -i "s/^version: .*/version: $version/; s/^appVersion: .*/appVersion: \"$version\"/" Chart.yaml
hack/changelog-yaml.sh > changelog.yaml
git add CHANGELOG.md Chart.yaml changelog.yaml
git commit -q -m "Release v$version (cut from $commit)"
echo "release: v$version recorded (cut from $commit) in $(git rev-parse --short HEAD)" >&2
if $tag; then git tag -a "v$version" -m "v$version (cut from $commit)"; fi
