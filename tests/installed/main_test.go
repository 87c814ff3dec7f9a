// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package installed runs the chart as Deckhouse installs it (development/PACKAGING.md, "The chart
// run as installed"): the documented ModuleConfig goes through the settings schema and the hooks
// to values, every rendered object is applied to a real API server, and the rendered containers
// run as real processes — the controller, one agent per simulated node and the real
// kube-rbac-proxy in front of each program's metrics — with the rendered arguments and
// environment, each as its rendered ServiceAccount with a token bound to its Pod and an
// in-cluster configuration, never as the administrator. Whatever the chart renders (admission
// policies included) is applied and in force.
package installed

import (
	"testing"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// TestMain isolates the package: network, mount and PID namespaces of its own (root only; the
// tests skip without root).
func TestMain(m *testing.M) { cluster.RunIsolated(m) }
