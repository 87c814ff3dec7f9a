package chart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// TestEveryRuleFileIsAPrometheusRule: each monitoring/prometheus-rules/*.yaml is rendered as one
// PrometheusRule in d8-monitoring for the main Prometheus, its groups exactly the file's.
func TestEveryRuleFileIsAPrometheusRule(t *testing.T) {
	root, err := bundle.Root()
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(root, "monitoring", "prometheus-rules", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	objs := render(t, bundle.ValueSets()[bundle.SetDefaults])
	rules := objs.OfKind("PrometheusRule")
	require.Len(t, rules, len(files))
	for _, f := range files {
		name := "service-with-healthchecks-" + strings.TrimSuffix(filepath.Base(f), ".yaml")
		t.Run(name, func(t *testing.T) {
			obj := objs.Get("PrometheusRule", bundle.MonitoringNamespace, name)
			require.NotNil(t, obj, "PrometheusRule %s in %s", name, bundle.MonitoringNamespace)
			labels := obj.GetLabels()
			assert.Equal(t, "main", labels["prometheus"])
			assert.Equal(t, "rules", labels["component"])
			assert.Equal(t, "service-with-healthchecks", labels["module"])
			assert.Equal(t, "deckhouse", labels["heritage"])

			data, err := os.ReadFile(f)
			require.NoError(t, err)
			var want []any
			require.NoError(t, yaml.Unmarshal(data, &want))
			got, ok, err := unstructured.NestedSlice(obj.Object, "spec", "groups")
			require.NoError(t, err)
			require.True(t, ok)
			assert.Equal(t, want, got, "the groups are the file's, unchanged (annotation templates included)")
		})
	}
	assert.Empty(t, render(t, bundle.ValueSets()[bundle.SetNoPlatform]).OfKind("PrometheusRule"),
		"no PrometheusRule without operator-prometheus-crd")
}

// TestEveryDashboardIsAGrafanaDashboardDefinition: with prometheus-crd enabled each
// monitoring/grafana-dashboards/<folder>/<file>.json is rendered as a GrafanaDashboardDefinition
// in its folder, the definition byte-for-byte the file. The kind's CRD ships with Deckhouse's
// prometheus module and is not available as a Go module, so it is render-tested only (the
// cluster tests cannot dry-run it).
func TestEveryDashboardIsAGrafanaDashboardDefinition(t *testing.T) {
	root, err := bundle.Root()
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(root, "monitoring", "grafana-dashboards", "*", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	set := bundle.ValueSets()[bundle.SetDefaults]
	assert.Empty(t, render(t, set).OfKind("GrafanaDashboardDefinition"), "no dashboards without prometheus-crd")
	set.EnabledModules = append(append([]string{}, set.EnabledModules...), "prometheus-crd")
	objs := render(t, set)
	require.Len(t, objs.OfKind("GrafanaDashboardDefinition"), len(files))
	for _, f := range files {
		folder := filepath.Base(filepath.Dir(f))
		name := "d8-service-with-healthchecks-" + folder + "-" + strings.TrimSuffix(filepath.Base(f), ".json")
		t.Run(name, func(t *testing.T) {
			obj := objs.Get("GrafanaDashboardDefinition", "", name)
			require.NotNil(t, obj, "GrafanaDashboardDefinition %s", name)
			assert.Equal(t, "deckhouse.io/v1", obj.GetAPIVersion())
			assert.Contains(t, obj.GetLabels(), "prometheus.deckhouse.io/grafana-dashboard")
			gotFolder, _, _ := unstructured.NestedString(obj.Object, "spec", "folder")
			assert.Equal(t, "Service With Healthchecks", gotFolder)
			def, _, _ := unstructured.NestedString(obj.Object, "spec", "definition")
			data, err := os.ReadFile(f)
			require.NoError(t, err)
			assert.JSONEq(t, string(data), def)
			var dash map[string]any
			require.NoError(t, json.Unmarshal([]byte(def), &dash))
			assert.NotEmpty(t, dash["title"])
		})
	}
}
