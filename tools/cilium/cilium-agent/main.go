// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Command cilium-agent is Cilium's agent (github.com/cilium/cilium/daemon) under the name the
// test bed starts it by: tools/build.sh names a binary after its package's last element, and
// Cilium's agent package is called "daemon".
package main

import (
	"github.com/cilium/cilium/daemon/cmd"
	"github.com/cilium/cilium/pkg/hive"
)

func main() {
	cmd.Execute(cmd.NewAgentCmd(func() *hive.Hive { return hive.New(cmd.Agent) }))
}
