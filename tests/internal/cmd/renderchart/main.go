// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Command renderchart prints the chart's objects of the given kinds, rendered with the default
// module settings, as a multi-document YAML stream. bench/publish uses it to install the chart's
// ValidatingAdmissionPolicies, so that the agent's slice writes pay the CEL cost they pay in a
// cluster (development/BENCHMARKS-HISTORY.md, "The admission policies in bench/publish").
//
//	go run ./tests/internal/cmd/renderchart -kinds ValidatingAdmissionPolicy,ValidatingAdmissionPolicyBinding
//
// Run from the repository root.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

func main() {
	kinds := flag.String("kinds", "", "comma-separated kinds to print (required)")
	flag.Parse()
	if *kinds == "" {
		fmt.Fprintln(os.Stderr, "renderchart: -kinds is required")
		os.Exit(2)
	}
	objs, err := bundle.ValueSets()[bundle.SetDefaults].Render()
	if err != nil {
		fmt.Fprintln(os.Stderr, "renderchart:", err)
		os.Exit(1)
	}
	n := 0
	for _, kind := range strings.Split(*kinds, ",") {
		for _, obj := range objs.OfKind(strings.TrimSpace(kind)) {
			out, err := yaml.Marshal(obj.Object)
			if err != nil {
				fmt.Fprintln(os.Stderr, "renderchart:", err)
				os.Exit(1)
			}
			fmt.Printf("---\n%s", out)
			n++
		}
	}
	if n == 0 {
		fmt.Fprintf(os.Stderr, "renderchart: the chart renders no object of kinds %s\n", *kinds)
		os.Exit(1)
	}
}
