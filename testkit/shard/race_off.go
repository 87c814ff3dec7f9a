// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build !race

package shard

// raceBuild: see race_on.go.
const raceBuild = false
