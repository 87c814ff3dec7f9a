// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

func TestEveryRenderedObjectPassesServerSideDryRun(t *testing.T) {
	// What exists before the module renders: the platform's monitoring namespace, the users'
	// namespaces, and the module namespace (the chart's first object).
	for _, ns := range []string{bundle.Namespace, bundle.MonitoringNamespace, bundle.CredentialsNSA, bundle.CredentialsNSB} {
		ensureNamespace(t, ns)
	}
	for name, set := range bundle.ValueSets() {
		t.Run(name, func(t *testing.T) {
			objs := render(t, set)
			require.NotEmpty(t, objs)
			kinds := objs.Counts()
			for _, obj := range objs {
				assert.NoError(t, write(t.Context(), obj, true), "server-side dry-run")
			}
			if set.EnabledModules != nil {
				assert.Equal(t, 2, kinds["PodMonitor"], "the monitoring kinds went through the API server too")
				assert.Equal(t, 2, kinds["VerticalPodAutoscaler"], "the autoscaling kinds went through the API server too")
				assert.Equal(t, ruleFiles(t), kinds["PrometheusRule"], "every alert rule file went through the API server as a PrometheusRule")
			}
		})
	}
}

// TestDryRunCatchesSchemaErrors proves the dry-run above can fail: an object with a field its
// kind does not have is rejected.
func TestDryRunCatchesSchemaErrors(t *testing.T) {
	ensureNamespace(t, bundle.Namespace)
	ensureNamespace(t, bundle.MonitoringNamespace)
	objs := render(t, bundle.ValueSets()[bundle.SetDefaults])
	for _, kind := range []string{"Deployment", "PodMonitor", "VerticalPodAutoscaler", "PrometheusRule"} {
		obj := objs.OfKind(kind)[0].DeepCopy()
		require.NoError(t, unstructured.SetNestedField(obj.Object, "no-such-field", "spec", "noSuchField"))
		err := write(t.Context(), obj, true)
		require.Error(t, err, kind)
		assert.Contains(t, err.Error(), "noSuchField", kind)
	}

	// The PrometheusRule schema checks the rules themselves, e.g. that "for" is a duration.
	rule := objs.OfKind("PrometheusRule")[0].DeepCopy()
	groups, _, err := unstructured.NestedSlice(rule.Object, "spec", "groups")
	require.NoError(t, err)
	require.NotEmpty(t, groups)
	g := groups[0].(map[string]any)
	rules := g["rules"].([]any)
	rules[0].(map[string]any)["for"] = "five minutes"
	require.NoError(t, unstructured.SetNestedSlice(rule.Object, groups, "spec", "groups"))
	err = write(t.Context(), rule, true)
	require.Error(t, err, "a rule whose for is not a duration is rejected")
	assert.Contains(t, err.Error(), "for", "the error names the field")
}

// ruleFiles is the number of alert rule files the chart ships as PrometheusRules.
func ruleFiles(t *testing.T) int {
	t.Helper()
	root, err := bundle.Root()
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(root, "monitoring", "prometheus-rules", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return len(files)
}

// TestAMalformedDockercfgIsRefusedWhenTheSecretIsWritten: the chart passes the platform's
// dockercfgs through unchanged, so one that is not a docker config JSON is caught by the API
// server, with a message, before any pod would fail to pull.
func TestAMalformedDockercfgIsRefusedWhenTheSecretIsWritten(t *testing.T) {
	ensureNamespace(t, bundle.Namespace)
	set := bundle.ValueSets()[bundle.SetExternal]
	values, err := set.Values()
	require.NoError(t, err)
	module := values[bundle.ValuesKey].(map[string]any)
	// base64 of the word "dockercfg": valid base64, not JSON (the value dmt renders with).
	module["registry"].(map[string]any)["dockercfg"] = "ZG9ja2VyY2Zn"
	rendered, err := bundle.Render(values)
	require.NoError(t, err)
	var checked int
	for _, obj := range bundle.Objects(rendered).OfKind("Secret") {
		err := write(t.Context(), obj, true)
		if obj.GetName() == "service-with-healthchecks-module-registry" {
			checked++
			require.Error(t, err, "the malformed dockercfg is refused")
			assert.Contains(t, err.Error(), ".dockerconfigjson")
			continue
		}
		assert.NoError(t, err, "the platform's well-formed dockercfg %s is accepted", obj.GetName())
	}
	assert.Equal(t, 1, checked, "the module's registry Secret was rendered and written")
}
