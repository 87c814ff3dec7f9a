// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package agent is the module root of the per-node agent: it probes the pods of its own node
// and publishes the passing ones as EndpointSlices. The program is in cmd/agent, its parts under
// internal/.
package agent
