// Package app runs the controller program from its parsed configuration.
package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/config"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/controller"
)

// Run runs the controller until ctx ends.
func Run(ctx context.Context, cfg config.Config) error {
	log := zap.New(zap.Level(cfg.LogLevel), zap.WriteTo(os.Stderr))
	ctrl.SetLogger(log)
	klog.SetLogger(log)

	restCfg, err := restConfig(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	restCfg.UserAgent = "service-with-healthchecks-controller"
	restCfg.QPS, restCfg.Burst = cfg.KubeAPIQPS, cfg.KubeAPIBurst
	mgr, _, err := controller.NewManager(restCfg, controller.Options{
		MetricsBindAddress:      cfg.MetricsBindAddress,
		HealthProbeBindAddress:  cfg.HealthProbeBindAddress,
		LeaderElect:             cfg.LeaderElect,
		LeaderElectionNamespace: cfg.LeaderElectionNamespace,
		AgentLeaseNamespace:     cfg.AgentLeaseNamespace,
		AgentLostGrace:          cfg.AgentLostGrace,
		Logger:                  log,
	})
	if err != nil {
		return err
	}
	log.Info("starting", "metricsBindAddress", cfg.MetricsBindAddress, "healthProbeBindAddress", cfg.HealthProbeBindAddress,
		"leaderElect", cfg.LeaderElect, "leaderElectionNamespace", cfg.LeaderElectionNamespace,
		"agentLeaseNamespace", cfg.AgentLeaseNamespace, "agentLostGrace", cfg.AgentLostGrace.String())
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the manager: %w", err)
	}
	return nil
}

// restConfig loads the kubeconfig file when one is named (flag or $KUBECONFIG, which may list
// several files), and the in-cluster configuration otherwise.
func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig or $KUBECONFIG and not running in a cluster: %w", err)
		}
		return c, nil
	}
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}
	if paths := filepath.SplitList(kubeconfig); len(paths) > 1 {
		rules = &clientcmd.ClientConfigLoadingRules{Precedence: paths}
	}
	c, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	return c, nil
}
