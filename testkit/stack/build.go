// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package stack

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

// Binaries are the paths of the programs the stack runs.
type Binaries struct {
	// Controller is images/controller/cmd/controller.
	Controller string
	// Agent is images/agent/cmd/agent.
	Agent string
}

// PrebuiltEnv names a folder that already holds `controller` and `agent` binaries; when set,
// Build uses them instead of building.
const PrebuiltEnv = "SWH_STACK_BIN_DIR"

// Build builds the controller and agent programs once per process (process.Build: `go build`
// in the repository's workspace) and returns their paths; with $SWH_STACK_BIN_DIR set it
// returns the binaries there.
func Build() (Binaries, error) {
	if dir := os.Getenv(PrebuiltEnv); dir != "" {
		b := Binaries{Controller: filepath.Join(dir, "controller"), Agent: filepath.Join(dir, "agent")}
		for _, p := range []string{b.Controller, b.Agent} {
			if _, err := os.Stat(p); err != nil {
				return Binaries{}, fmt.Errorf("$%s: %w", PrebuiltEnv, err)
			}
		}
		return b, nil
	}
	controller, err := process.Build("images/controller", "./cmd/controller")
	if err != nil {
		return Binaries{}, err
	}
	agent, err := process.Build("images/agent", "./cmd/agent")
	if err != nil {
		return Binaries{}, err
	}
	return Binaries{Controller: controller, Agent: agent}, nil
}
