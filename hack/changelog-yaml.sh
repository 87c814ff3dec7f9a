#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Prints changelog.yaml, the newest release's changelog Deckhouse reads from the release image,
# from the newest "## v<version>" section of CHANGELOG.md: its version, its commit, and one list
# per "### <group>" (lower case, spaces as underscores) of its entries, each on one line, as a
# YAML double-quoted string (backslashes and quotes escaped).
# hack/release.sh writes it; tests/release holds it equal to CHANGELOG.md.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
awk '
	function flush() { if (entry != "") { gsub(/\\/, "&&", entry); gsub(/"/, "\\\"", entry); print "  - \"" entry "\""; entry = "" } }
	/^## v/ { if (seen) exit; seen = 1
		print "# The newest release of CHANGELOG.md, written by hack/changelog-yaml.sh: Deckhouse reads it"
		print "# from the release image (.werf/release.yaml). Do not edit; tests/release checks it."
		print "version: " substr($0, 4); next }
	!seen { next }
	/^Commit: / { c = $2; gsub(/`/, "", c); print "commit: \"" c "\""; next }
	/^### / { flush(); g = tolower(substr($0, 5)); gsub(/ /, "_", g); print g ":"; next }
	/^- / { flush(); entry = substr($0, 3); next }
	/^  / && entry != "" { line = $0; sub(/^ +/, "", line); entry = entry " " line; next }
	/^$/ { flush() }
	END { flush() }' "$root/CHANGELOG.md"
