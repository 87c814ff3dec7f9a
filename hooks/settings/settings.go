// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package settings turns the module configuration into the internal values the templates use
// (derived values that Helm should not compute itself).
package settings

import (
	"context"

	"github.com/deckhouse/module-sdk/pkg"
	"github.com/deckhouse/module-sdk/pkg/registry"
)

// Values paths.
const (
	// ValuesModuleHA is the module's own highAvailability setting (optional).
	ValuesModuleHA = "serviceWithHealthchecks.highAvailability"
	// ValuesGlobalHA is the platform-wide highAvailability value.
	ValuesGlobalHA = "global.highAvailability"
	// ValuesReplicas is where the controller's replica count is written.
	ValuesReplicas = "serviceWithHealthchecks.internal.controller.replicas"
)

// Replica counts.
const (
	// ReplicasHA is the controller's replica count with high availability: two, one of them
	// the leader, the other ready to take over.
	ReplicasHA = 2
	// ReplicasSingle is the controller's replica count without high availability.
	ReplicasSingle = 1
)

// Config runs the hook before every Helm render.
var Config = &pkg.HookConfig{
	OnBeforeHelm: &pkg.OrderedConfig{Order: 5},
}

var _ = registry.RegisterFunc(Config, Handle)

// Handle writes the derived values.
func Handle(_ context.Context, input *pkg.HookInput) error {
	input.Values.Set(ValuesReplicas, Replicas(input.Values))
	return nil
}

// Replicas is the controller's replica count: the module's highAvailability setting when set,
// else the platform's global.highAvailability when known, else high availability.
func Replicas(values pkg.PatchableValuesCollector) int {
	if v, ok := values.GetOk(ValuesModuleHA); ok {
		return replicas(v.Bool())
	}
	if v, ok := values.GetOk(ValuesGlobalHA); ok {
		return replicas(v.Bool())
	}
	return ReplicasHA
}

func replicas(ha bool) int {
	if ha {
		return ReplicasHA
	}
	return ReplicasSingle
}
