// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build race

package controller

// raceDetector tells whether the test binary was built with -race.
const raceDetector = true
