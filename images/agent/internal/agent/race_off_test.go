// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build !race

package agent_test

// raceBuild: see race_on_test.go.
const raceBuild = false
