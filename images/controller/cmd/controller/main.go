// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Command controller keeps, for every ServiceWithHealthchecks, a Service of the same name with an
// empty selector, writes the resource's status and removes EndpointSlices that belong to nothing.
package main

import (
	"context"
	"io"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/app"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/config"
	"github.com/deckhouse/service-with-healthchecks/lib/cmdline"
	"github.com/deckhouse/service-with-healthchecks/lib/memlimit"
)

func main() {
	os.Exit(cmdline.Report(os.Stderr, config.Program, run(ctrl.SetupSignalHandler(), os.Args[1:], os.Stdout)))
}

// run is the program: its hidden describe-metrics command, or flags → config → the manager
// until ctx ends. Its error decides the exit code (cmdline.Report).
func run(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 1 && args[0] == describeMetricsCommand {
		return describeMetrics(stdout)
	}
	cfg, err := config.Parse(args, os.Getenv, stdout)
	if err != nil {
		return err
	}
	// The runtime collects harder below the container's limit, not at the kernel's OOM kill
	// (development/CONTROLLER.md, "Memory").
	memlimit.Set(os.Getenv)
	return app.Run(ctx, cfg)
}
