// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build race

package agent_test

// raceBuild: under the race detector (make test-race) the package runs in one process, as
// hack/test-race.sh runs its binaries one at a time (shard_test.go).
const raceBuild = true
