// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cmdline

import (
	"fmt"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// RESTConfig is the API server configuration of the flags: the kubeconfig file named by
// --kubeconfig (or $KUBECONFIG, its default; a list of files is merged like kubectl does),
// otherwise the in-cluster service account; the --kube-api-qps and --kube-api-burst limits; and
// userAgent.
func (c *Common) RESTConfig(userAgent string) (*rest.Config, error) {
	cfg, err := loadRESTConfig(c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = c.KubeAPIQPS, c.KubeAPIBurst
	cfg.UserAgent = userAgent
	return cfg, nil
}

func loadRESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig or $KUBECONFIG and not running in a cluster: %w", err)
		}
		return cfg, nil
	}
	// One file must exist; in a list, missing files are skipped, as kubectl does.
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}
	if paths := filepath.SplitList(kubeconfig); len(paths) > 1 {
		rules = &clientcmd.ClientConfigLoadingRules{Precedence: paths}
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}
