// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package probebudget is the note an agent leaves on its node Lease about the resources whose
// targets exceed its probe budget (development/AGENT.md, "Probe budget"), and its reading by
// the controller, which shows it as the ProbeBudgetExceeded condition: the status has one
// writer (DESIGN §6), the agent only reports.
package probebudget

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Annotation on an agent's node Lease holds the Note (absent: nothing over budget).
const Annotation = "network.deckhouse.io/probe-budget-exceeded"

// MaxResources bounds the resources one Note names (the annotation stays a few kilobytes);
// Note.More counts the rest.
const MaxResources = 200

// Note is what an agent reports: its budget and the resources over it.
type Note struct {
	// Budget is the agent's --max-probe-targets.
	Budget int `json:"budget"`
	// Over are the resources with targets over budget, at most MaxResources.
	Over []Resource `json:"over"`
	// More is how many more resources are over budget than Over names.
	More int `json:"more,omitempty"`
}

// Resource is one resource over budget on the node.
type Resource struct {
	// Namespace and Name of the ServiceWithHealthchecks.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Asked is how many targets (pod × probe) it has on the node, Allowed how many are probed.
	Asked   int `json:"asked"`
	Allowed int `json:"allowed"`
}

// Encode is the annotation value of n, keeping the first MaxResources of n.Over in
// namespace/name order; "" when nothing is over budget.
func Encode(n Note) string {
	if len(n.Over) == 0 && n.More == 0 {
		return ""
	}
	over := slices.Clone(n.Over)
	slices.SortFunc(over, func(a, b Resource) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	if len(over) > MaxResources {
		n.More += len(over) - MaxResources
		over = over[:MaxResources]
	}
	n.Over = over
	raw, err := json.Marshal(n)
	if err != nil {
		// Plain data: this cannot happen.
		return ""
	}
	return string(raw)
}

// Parse reads an annotation value ("" is an empty Note).
func Parse(value string) (Note, error) {
	var n Note
	if value == "" {
		return n, nil
	}
	if err := json.Unmarshal([]byte(value), &n); err != nil {
		return Note{}, fmt.Errorf("reading the %s annotation: %w", Annotation, err)
	}
	if len(n.Over) > MaxResources {
		n.More += len(n.Over) - MaxResources
		n.Over = n.Over[:MaxResources]
	}
	return n, nil
}
