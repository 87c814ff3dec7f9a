// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
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

// TestMonitoringFilesAreTheShapeTheHelperReads: templates/monitoring.yaml reads rule files
// directly in monitoring/prometheus-rules and dashboards one folder deep, as .yaml and .json;
// lib-helm's helpers would also read .tpl files and deeper folders. With none of those, the two
// render the same objects.
func TestMonitoringFilesAreTheShapeTheHelperReads(t *testing.T) {
	root, err := bundle.Root()
	require.NoError(t, err)
	for dir, want := range map[string]string{
		"monitoring/prometheus-rules":   ".yaml",
		"monitoring/grafana-dashboards": ".json",
	} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(filepath.Join(root, dir), path)
			if d.IsDir() {
				depth := strings.Count(rel, string(filepath.Separator))
				switch {
				case rel == ".":
				case dir == "monitoring/prometheus-rules" && rel == "tests":
					return filepath.SkipDir // promtool's unit tests, left out of the chart by .helmignore
				case dir == "monitoring/prometheus-rules" || depth > 0:
					t.Errorf("%s/%s: the helper reads no subfolders here", dir, rel)
				}
				return nil
			}
			assert.Equal(t, want, filepath.Ext(path), "%s/%s: the helper reads only %s files", dir, rel, want)
			return nil
		})
		require.NoError(t, err)
	}
}

// TestRulesFollowTheHelperContract checks the parts of helm_lib_prometheus_rules' contract that
// the module's own rule files do not exercise, on a rule file given to the chart for the test.
func TestRulesFollowTheHelperContract(t *testing.T) {
	const file = "monitoring/prometheus-rules/contract_check.yaml"
	rules := []byte(`- name: contract.check
  rules:
  - alert: Windowed
    expr: rate(x[__SCRAPE_INTERVAL_X_4__]) > 0
    for: __SCRAPE_INTERVAL_X_2__
  - alert: QuietDuringUpdates
    expr: up == 0
    annotations:
      d8_ignore_on_update: "true"
      summary: '{{ $labels.instance }} is down'
- name: contract.second
  rules:
  - record: y
    expr: sum(up)
`)
	render := func(t *testing.T, enabled []string, apiVersions []any, interval any) bundle.Objects {
		t.Helper()
		set := bundle.ValueSets()[bundle.SetNoPlatform]
		set.EnabledModules = enabled
		values, err := set.Values()
		require.NoError(t, err)
		discovery := values["global"].(map[string]any)["discovery"].(map[string]any)
		discovery["prometheusScrapeInterval"] = interval
		if apiVersions != nil {
			discovery["apiVersions"] = apiVersions
		}
		objs, err := bundle.RenderWithFiles(values, nil, map[string][]byte{file: rules})
		require.NoError(t, err)
		return objs
	}

	t.Run("the scrape interval and the update guard are filled in", func(t *testing.T) {
		objs := render(t, []string{"operator-prometheus-crd"}, nil, 15)
		obj := objs.Get("PrometheusRule", bundle.MonitoringNamespace, "service-with-healthchecks-contract-check")
		require.NotNil(t, obj, "the file's name has _ and . turned into -")
		groups, _, err := unstructured.NestedSlice(obj.Object, "spec", "groups")
		require.NoError(t, err)
		require.Len(t, groups, 2)
		first := groups[0].(map[string]any)["rules"].([]any)
		windowed := first[0].(map[string]any)
		assert.Equal(t, "rate(x[60s]) > 0", windowed["expr"])
		assert.Equal(t, "30s", windowed["for"])
		quiet := first[1].(map[string]any)
		assert.Equal(t, "(up == 0) and ON() ((max(d8_is_updating) != 1) or ON() absent(d8_is_updating))", quiet["expr"])
		assert.Equal(t, "{{ $labels.instance }} is down", quiet["annotations"].(map[string]any)["summary"],
			"annotation templates are left to Prometheus")
	})

	t.Run("with the observability module each group becomes a ClusterObservabilityMetricsRulesGroup", func(t *testing.T) {
		objs := render(t, []string{"operator-prometheus-crd", "observability"},
			[]any{"observability.deckhouse.io/v1alpha1/ClusterObservabilityMetricsRulesGroup"}, 30)
		assert.Empty(t, objs.OfKind("PrometheusRule"))
		for i, name := range []string{"contract.check", "contract.second"} {
			obj := objs.Get("ClusterObservabilityMetricsRulesGroup", "", "service-with-healthchecks-contract-check-"+strconv.Itoa(i))
			require.NotNil(t, obj, "group %d", i)
			assert.Equal(t, "main", obj.GetLabels()["prometheus"])
			assert.Equal(t, "rules", obj.GetLabels()["component"])
			_, hasName, _ := unstructured.NestedString(obj.Object, "spec", "name")
			assert.False(t, hasName, "the group's name %q is left out of the spec", name)
			rules, _, _ := unstructured.NestedSlice(obj.Object, "spec", "rules")
			assert.NotEmpty(t, rules)
		}
		assert.Len(t, objs.OfKind("ClusterObservabilityMetricsRulesGroup"), 2+countGroups(t),
			"every group of every rule file, the module's own included")
	})

	t.Run("the observability module alone, without its API, keeps PrometheusRules", func(t *testing.T) {
		objs := render(t, []string{"operator-prometheus-crd", "observability"}, []any{}, 30)
		assert.NotNil(t, objs.Get("PrometheusRule", bundle.MonitoringNamespace, "service-with-healthchecks-contract-check"))
		assert.Empty(t, objs.OfKind("ClusterObservabilityMetricsRulesGroup"))
	})
}

// countGroups is the number of rule groups in the module's own rule files.
func countGroups(t *testing.T) int {
	t.Helper()
	root, err := bundle.Root()
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(root, "monitoring", "prometheus-rules", "*.yaml"))
	require.NoError(t, err)
	n := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		var groups []any
		require.NoError(t, yaml.Unmarshal(data, &groups))
		n += len(groups)
	}
	return n
}

func TestDashboardsFollowTheHelperContractWithTheObservabilityModule(t *testing.T) {
	set := bundle.ValueSets()[bundle.SetNoPlatform]
	set.EnabledModules = []string{"prometheus-crd", "observability"}
	objs := render(t, set)
	defs := objs.OfKind("GrafanaDashboardDefinition")
	require.NotEmpty(t, defs)
	require.Len(t, objs.OfKind("ClusterObservabilityDashboard"), len(defs), "one ClusterObservabilityDashboard per dashboard")
	for _, def := range defs {
		assert.Contains(t, def.GetLabels(), "observability.deckhouse.io/skip-dashboard-conversion")
		obs := objs.Get("ClusterObservabilityDashboard", "", def.GetName())
		require.NotNil(t, obs, def.GetName())
		folder, _, _ := unstructured.NestedString(def.Object, "spec", "folder")
		assert.Equal(t, folder, obs.GetAnnotations()["metadata.deckhouse.io/category"])
		assert.Equal(t, "module", obs.GetLabels()["observability.deckhouse.io/dashboard-origin"])
		want, _, _ := unstructured.NestedString(def.Object, "spec", "definition")
		got, _, _ := unstructured.NestedString(obs.Object, "spec", "definition")
		assert.Equal(t, want, got)
	}
}
