// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build race

package shard

// raceBuild: under the race detector (make test-race) a package runs in one process.
const raceBuild = true
