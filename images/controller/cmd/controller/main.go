// Command controller keeps, for every ServiceWithHealthchecks, a Service of the same name with an
// empty selector, writes the resource's status and removes EndpointSlices that belong to nothing.
package main

import (
	"errors"
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/app"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/config"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == describeMetricsCommand {
		if err := describeMetrics(os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "controller: %v\n", err)
			os.Exit(1)
		}
		return
	}
	cfg, err := config.Parse(os.Args[1:], os.Getenv, os.Stdout)
	if errors.Is(err, config.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "controller: %v (see --help)\n", err)
		os.Exit(2)
	}
	if err := app.Run(ctrl.SetupSignalHandler(), cfg); err != nil {
		fmt.Fprintf(os.Stderr, "controller: %v\n", err)
		os.Exit(1)
	}
}
