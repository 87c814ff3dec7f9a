// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build race

package process

// raceBuild tells whether this binary was built with -race: Build then builds the programs
// with -race too, into binaries of their own.
const raceBuild = true
