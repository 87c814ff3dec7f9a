// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package openapi tests the module's settings schemas: the case file's positive and negative
// cases, and that the defaults the chart tests render with are the schemas' own.
package openapi

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

type caseFile struct {
	Positive cases `json:"positive"`
	Negative cases `json:"negative"`
}

type cases struct {
	ConfigValues []map[string]any `json:"configValues"`
	Values       []map[string]any `json:"values"`
}

func validator(t *testing.T, name string) *validate.SchemaValidator {
	t.Helper()
	s, err := bundle.Schema(name)
	require.NoError(t, err)
	return validate.NewSchemaValidator(s, nil, "", strfmt.Default)
}

func loadCases(t *testing.T) caseFile {
	t.Helper()
	raw, err := bundle.ReadYAML("openapi/openapi-case-tests.yaml")
	require.NoError(t, err)
	var f caseFile
	require.NoError(t, bundle.FromGeneric(raw, &f))
	require.NotEmpty(t, f.Positive.ConfigValues)
	require.NotEmpty(t, f.Negative.ConfigValues)
	require.NotEmpty(t, f.Positive.Values)
	require.NotEmpty(t, f.Negative.Values)
	return f
}

func TestCaseFile(t *testing.T) {
	f := loadCases(t)
	schemas := map[string]*validate.SchemaValidator{
		"config-values.yaml": validator(t, "config-values.yaml"),
		"values.yaml":        validator(t, "values.yaml"),
	}
	run := func(t *testing.T, kind, schema string, list []map[string]any, wantValid bool) {
		for i, obj := range list {
			t.Run(fmt.Sprintf("%s %s case %d against %s", map[bool]string{true: "positive", false: "negative"}[wantValid], kind, i, schema), func(t *testing.T) {
				res := schemas[schema].Validate(obj)
				if wantValid {
					assert.True(t, res.IsValid(), "%v must validate: %v", obj, res.Errors)
				} else {
					assert.False(t, res.IsValid(), "%v must be rejected", obj)
				}
			})
		}
	}
	run(t, "configValues", "config-values.yaml", f.Positive.ConfigValues, true)
	run(t, "configValues", "config-values.yaml", f.Negative.ConfigValues, false)
	// Settings are values too: every settings case holds the same way against values.yaml.
	run(t, "configValues", "values.yaml", f.Positive.ConfigValues, true)
	run(t, "configValues", "values.yaml", f.Negative.ConfigValues, false)
	run(t, "values", "values.yaml", f.Positive.Values, true)
	run(t, "values", "values.yaml", f.Negative.Values, false)
}

func TestAnUnknownKeyIsRejectedWithItsName(t *testing.T) {
	res := validator(t, "config-values.yaml").Validate(map[string]any{"loglevel": "Debug"})
	require.False(t, res.IsValid())
	assert.Contains(t, fmt.Sprint(res.Errors), "loglevel")
}

func TestDefaultsAreValidAndComplete(t *testing.T) {
	schema, err := bundle.SchemaMap("values.yaml")
	require.NoError(t, err)
	values := map[string]any{"internal": map[string]any{}}
	bundle.ApplyDefaults(schema, values)

	assert.Equal(t, map[string]any{
		"logLevel":       "Info",
		"agentLostGrace": "40s",
		"controller":     map[string]any{"kubeAPIQPS": float64(50), "kubeAPIBurst": float64(100)},
		"agent":          map[string]any{"probeConcurrency": float64(64), "maxProbeTargets": float64(20000), "kubeAPIQPS": float64(20), "kubeAPIBurst": float64(40)},
		// Only external IPs are refused by default; Service types, classes and annotations pass
		// as before the setting existed (a narrower default would refuse edits of live resources).
		"childService": map[string]any{
			"externalIPs":    "Forbidden",
			"loadBalancerIP": "Allowed",
			"types":          []any{"ClusterIP", "NodePort", "LoadBalancer"},
			"annotations":    map[string]any{"forbidden": []any{}},
		},
		"internal": map[string]any{
			"controller":         map[string]any{"replicas": float64(2)},
			"agent":              map[string]any{"leaseRenewInterval": "10s"},
			"credentialSecrets":  []any{},
			"credentialProblems": []any{},
		},
	}, values, "the defaults agree with the programs' agreed defaults (DESIGN §12)")
	res := validator(t, "values.yaml").Validate(values)
	assert.True(t, res.IsValid(), "%v", res.Errors)
}

// TestEverySettingIsDocumentedInRussian: each property of config-values.yaml has a description
// in doc-ru-config-values.yaml.
func TestEverySettingIsDocumentedInRussian(t *testing.T) {
	en, err := bundle.ReadYAML("openapi/config-values.yaml")
	require.NoError(t, err)
	ru, err := bundle.ReadYAML("openapi/doc-ru-config-values.yaml")
	require.NoError(t, err)
	var walk func(path string, en, ru map[string]any)
	walk = func(path string, en, ru map[string]any) {
		props, _ := en["properties"].(map[string]any)
		ruProps, _ := ru["properties"].(map[string]any)
		for name, p := range props {
			rp, _ := ruProps[name].(map[string]any)
			if !assert.NotNil(t, rp, "%s%s has no Russian description", path, name) {
				continue
			}
			assert.NotEmpty(t, rp["description"], "%s%s has no Russian description", path, name)
			walk(path+name+".", p.(map[string]any), rp)
		}
	}
	walk("", en, ru)
}
