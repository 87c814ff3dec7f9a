// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package app runs the controller program from its parsed configuration.
package app

import (
	"context"
	"fmt"
	"os"

	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/config"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/controller"
)

// Run runs the controller until ctx ends.
func Run(ctx context.Context, cfg config.Config) error {
	log := cfg.SetupLogger(os.Stderr)
	restCfg, err := cfg.RESTConfig("service-with-healthchecks-controller")
	if err != nil {
		return err
	}
	mgr, _, err := controller.NewManager(restCfg, controller.Options{
		MetricsBindAddress:      cfg.MetricsBindAddress,
		HealthProbeBindAddress:  cfg.HealthProbeBindAddress,
		LeaderElect:             cfg.LeaderElect,
		LeaderElectionNamespace: cfg.LeaderElectionNamespace,
		AgentLeaseNamespace:     cfg.AgentLeaseNamespace,
		AgentLostGrace:          cfg.AgentLostGrace,
		MaxConcurrentReconciles: cfg.MaxConcurrentReconciles,
		Logger:                  log,
	})
	if err != nil {
		return err
	}
	log.Info("starting", "metricsBindAddress", cfg.MetricsBindAddress, "healthProbeBindAddress", cfg.HealthProbeBindAddress,
		"leaderElect", cfg.LeaderElect, "leaderElectionNamespace", cfg.LeaderElectionNamespace,
		"agentLeaseNamespace", cfg.AgentLeaseNamespace, "agentLostGrace", cfg.AgentLostGrace.String(),
		"maxConcurrentReconciles", cfg.MaxConcurrentReconciles)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the manager: %w", err)
	}
	return nil
}
