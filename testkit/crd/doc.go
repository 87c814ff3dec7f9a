// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package crd holds the tests of the ServiceWithHealthchecks CRD against a real API server:
// every validation rule rejects what it should with a message a person understands, and valid
// resources are accepted with their defaults applied.
package crd
