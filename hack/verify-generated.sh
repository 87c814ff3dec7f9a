#!/usr/bin/env bash
# Copyright The service-with-healthchecks Authors.
# SPDX-License-Identifier: Apache-2.0
# Fails when the generated files (api's deepcopy code, the CRD) are not what `make generate`
# writes from the Go types: the first check of `make verify`.
#
# It generates into a copy of api/ and compares, and never writes the checkout, so `make verify`
# can run beside the steps that compile it (.ci/run runs it beside `make lint` and `make
# test-race`). The copy is type-checked in a workspace of its own that lists the copy and every
# other module of go.work by its absolute path: the same module versions as `make generate` in
# the checkout sees.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bin=$(tools/build.sh --dir codegen)
tools/build.sh codegen

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -a api "$tmp/api"
{
	echo "go $(go work edit -json | sed -n 's/^[[:space:]]*"Go": "\(.*\)",*$/\1/p')"
	echo "use ("
	echo "	$tmp/api"
	go work edit -json | sed -n 's/^[[:space:]]*"DiskPath": "\(.*\)"$/\1/p' | while read -r m; do
		[[ $m == ./api ]] || echo "	$root/${m#./}"
	done
	echo ")"
} >"$tmp/go.work"
[[ ! -f go.work.sum ]] || cp go.work.sum "$tmp/go.work.sum"

export GOWORK=$tmp/go.work
(cd "$tmp/api" && "$bin/controller-gen" object paths=./...)
(cd "$tmp/api" && "$bin/controller-gen" crd paths=./... output:crd:stdout) | hack/crd-header.sh >"$tmp/crd.yaml"

status=0
diff -ru api "$tmp/api" >&2 || status=1
diff -u crds/servicewithhealthchecks.yaml "$tmp/crd.yaml" >&2 || status=1
if [[ $status -ne 0 ]]; then
	echo "verify: generated files are out of date: run 'make generate' and commit" >&2
	exit 1
fi
