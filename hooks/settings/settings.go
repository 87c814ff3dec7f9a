// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package settings turns the module configuration into the internal values the templates use
// (derived values that Helm should not compute itself).
package settings

import (
	"context"
	"fmt"
	"time"

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
	// ValuesAgentLostGrace is the agentLostGrace setting, a Go duration (the platform fills in
	// its default).
	ValuesAgentLostGrace = "serviceWithHealthchecks.agentLostGrace"
	// ValuesLeaseRenewInterval is where the agents' --lease-renew-interval is written.
	ValuesLeaseRenewInterval = "serviceWithHealthchecks.internal.agent.leaseRenewInterval"
)

// Replica counts.
const (
	// ReplicasHA is the controller's replica count with high availability: two, one of them
	// the leader, the other ready to take over.
	ReplicasHA = 2
	// ReplicasSingle is the controller's replica count without high availability.
	ReplicasSingle = 1
)

// Lease renewal of the agents.
const (
	// DefaultAgentLostGrace is agentLostGrace's default in openapi/config-values.yaml (and the
	// controller's --agent-lost-grace default), used when the value is absent.
	DefaultAgentLostGrace = 40 * time.Second
	// MinAgentLostGrace is the smallest grace the settings schema admits: at a quarter of it the
	// agents renew once a second. The controller's --agent-lost-grace refuses less too
	// (images/controller/internal/config, MinAgentLostGrace).
	MinAgentLostGrace = 4 * time.Second
	// RenewalsPerGrace is how many renewal intervals fit in one grace: three renewals in a row
	// may fail or be late before the controller withdraws anything.
	RenewalsPerGrace = 4
	// MaxLeaseRenewInterval is the agents' own default interval (lease.DefaultRenewInterval),
	// kept for every grace of 40 s and more.
	MaxLeaseRenewInterval = 10 * time.Second
)

// Config runs the hook before every Helm render.
var Config = &pkg.HookConfig{
	OnBeforeHelm: &pkg.OrderedConfig{Order: 5},
}

var _ = registry.RegisterFunc(Config, Handle)

// Handle writes the derived values.
func Handle(_ context.Context, input *pkg.HookInput) error {
	interval, err := LeaseRenewInterval(input.Values)
	if err != nil {
		return err
	}
	input.Values.Set(ValuesReplicas, Replicas(input.Values))
	input.Values.Set(ValuesLeaseRenewInterval, interval.String())
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

// LeaseRenewInterval is how often the agents renew their Lease for the controller's
// agentLostGrace (DefaultAgentLostGrace when absent), by RenewInterval. Helm cannot parse a
// Go duration, so the hook computes it. A grace that is not a positive Go duration is an error
// (the settings schema refuses it before the hook runs).
func LeaseRenewInterval(values pkg.PatchableValuesCollector) (time.Duration, error) {
	grace := DefaultAgentLostGrace
	if v, ok := values.GetOk(ValuesAgentLostGrace); ok {
		d, err := time.ParseDuration(v.String())
		if err != nil {
			return 0, fmt.Errorf("agentLostGrace %q: %w", v.String(), err)
		}
		if d <= 0 {
			return 0, fmt.Errorf("agentLostGrace %q: must be positive", v.String())
		}
		grace = d
	}
	return RenewInterval(grace), nil
}

// RenewInterval is the agents' renewal interval for a grace: a RenewalsPerGrace-th of it,
// truncated to milliseconds, at most MaxLeaseRenewInterval, at least a millisecond.
func RenewInterval(grace time.Duration) time.Duration {
	d := min(grace/RenewalsPerGrace, MaxLeaseRenewInterval).Truncate(time.Millisecond)
	return max(d, time.Millisecond)
}
