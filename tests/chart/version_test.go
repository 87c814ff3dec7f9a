// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// TestChartLabelsThePodsWithTheVersion: the controller and agent pods carry
// app.kubernetes.io/version, Chart.yaml's appVersion (the release the programs are stamped with;
// tests/release holds it to CHANGELOG.md), in every value set.
func TestChartLabelsThePodsWithTheVersion(t *testing.T) {
	root, err := bundle.Root()
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(root, "Chart.yaml"))
	require.NoError(t, err)
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	require.NoError(t, yaml.Unmarshal(b, &chart))
	require.NotEmpty(t, chart.AppVersion, "Chart.yaml has an appVersion")
	for name, set := range bundle.ValueSets() {
		t.Run(name, func(t *testing.T) {
			objs := render(t, set)
			ctrl, err := objs.Deployment(bundle.Namespace, "controller")
			require.NoError(t, err)
			agent, err := objs.DaemonSet(bundle.Namespace, "agent")
			require.NoError(t, err)
			assert.Equal(t, chart.AppVersion, ctrl.Spec.Template.Labels["app.kubernetes.io/version"], "controller pods")
			assert.Equal(t, chart.AppVersion, agent.Spec.Template.Labels["app.kubernetes.io/version"], "agent pods")
		})
	}
}
