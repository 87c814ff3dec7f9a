// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package bundle

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Versions of the Go modules that ship the CRDs of the monitoring and autoscaling kinds.
const (
	PrometheusOperatorModule = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
	VPAModule                = "k8s.io/autoscaler/vertical-pod-autoscaler@v1.8.1"
)

// ModuleDir downloads a Go module into the module cache (a no-op when it is there) and returns
// its folder.
func ModuleDir(module string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", module)
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	var info struct {
		Dir   string
		Error string
	}
	if jerr := json.Unmarshal(out, &info); jerr != nil || info.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %v %s (%w)", module, info.Error, out, err)
	}
	return info.Dir, nil
}

// PlatformCRDPaths are the CRD files of the kinds the chart renders besides its own: the
// prometheus-operator's PodMonitor and PrometheusRule, and the VerticalPodAutoscaler.
func PlatformCRDPaths() ([]string, error) {
	prom, err := ModuleDir(PrometheusOperatorModule)
	if err != nil {
		return nil, err
	}
	vpa, err := ModuleDir(VPAModule)
	if err != nil {
		return nil, err
	}
	paths := []string{
		filepath.Join(prom, "example", "prometheus-operator-crd", "monitoring.coreos.com_podmonitors.yaml"),
		filepath.Join(prom, "example", "prometheus-operator-crd", "monitoring.coreos.com_prometheusrules.yaml"),
		filepath.Join(vpa, "deploy", "vpa-v1-crd-gen.yaml"),
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("CRD file: %w", err)
		}
	}
	return paths, nil
}
