// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package docs

import (
	"bufio"
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// moduleName is the ModuleConfig name that enables the module.
const moduleName = "service-with-healthchecks"

func settingsValidator(t *testing.T) *validate.SchemaValidator {
	t.Helper()
	s, err := bundle.Schema("config-values.yaml")
	require.NoError(t, err)
	return validate.NewSchemaValidator(s, nil, "", strfmt.Default)
}

// TestEveryModuleConfigExampleMatchesTheSettingsSchema checks the ModuleConfig examples of the
// docs, which no API server here serves, against openapi/config-values.yaml as the platform does.
func TestEveryModuleConfigExampleMatchesTheSettingsSchema(t *testing.T) {
	v := settingsValidator(t)
	// The validator can fail: an unknown setting and a wrong type are rejected.
	for _, bad := range []map[string]any{{"logLevel": "Verbose"}, {"agent": map[string]any{"probeConcurrency": "many"}}, {"unknownSetting": true}} {
		assert.False(t, v.Validate(bad).IsValid(), "settings %v must be rejected", bad)
	}

	names, err := markdownFiles()
	require.NoError(t, err)
	found := 0
	for _, name := range names {
		md, err := readDoc(name)
		require.NoError(t, err)
		examples, err := examplesOf(name, md)
		require.NoError(t, err)
		for _, ex := range examples {
			if ex.obj.GetKind() != "ModuleConfig" {
				continue
			}
			found++
			t.Run(ex.where, func(t *testing.T) {
				obj := ex.obj.Object
				assert.Equal(t, "deckhouse.io/v1alpha1", ex.obj.GetAPIVersion())
				assert.Equal(t, moduleName, ex.obj.GetName(), "the ModuleConfig must be named after the module")
				spec, _ := obj["spec"].(map[string]any)
				require.NotNil(t, spec, "a ModuleConfig has a spec")
				if e, ok := spec["enabled"]; ok {
					assert.IsType(t, true, e, "spec.enabled is a boolean")
				}
				if settings, ok := spec["settings"]; ok {
					assert.Contains(t, spec, "version", "settings need spec.version")
					m, isMap := settings.(map[string]any)
					require.True(t, isMap, "spec.settings is an object")
					res := v.Validate(m)
					assert.True(t, res.IsValid(), "spec.settings do not match openapi/config-values.yaml: %v", res.Errors)
				}
			})
		}
	}
	assert.Positive(t, found, "the docs show at least one ModuleConfig")
}

// settingPaths lists the leaf settings of config-values.yaml ("agent.kubeAPIQPS").
func settingPaths(t *testing.T) map[string]bool {
	t.Helper()
	schema, err := bundle.SchemaMap("config-values.yaml")
	require.NoError(t, err)
	out := map[string]bool{}
	var rec func(prefix string, n map[string]any)
	rec = func(prefix string, n map[string]any) {
		props, ok := n["properties"].(map[string]any)
		if !ok || len(props) == 0 {
			out[strings.TrimSuffix(prefix, ".")] = true
			return
		}
		for k, v := range props {
			child, _ := v.(map[string]any)
			rec(prefix+k+".", child)
		}
	}
	rec("", schema)
	delete(out, "")
	return out
}

var tableFirstCell = regexp.MustCompile("^\\|\\s*`([A-Za-z0-9.]+)`\\s*\\|")

// settingsTable returns the first cells of the table whose header's first cell is one of heads.
func settingsTable(md []byte, heads ...string) ([]string, error) {
	var out []string
	in := false
	sc := bufio.NewScanner(bytes.NewReader(md))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "|") {
			if in {
				break
			}
			continue
		}
		if !in {
			cells := strings.Split(strings.Trim(line, "|"), "|")
			for _, h := range heads {
				if strings.EqualFold(strings.TrimSpace(cells[0]), h) {
					in = true
				}
			}
			continue
		}
		if m := tableFirstCell.FindStringSubmatch(line); m != nil {
			out = append(out, m[1])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("scanning: %w", err)
	}
	return out, nil
}

func TestConfigurationPagesAndTheSettingsSchemaListTheSameSettings(t *testing.T) {
	schema := settingPaths(t)
	require.Contains(t, schema, "agent.probeConcurrency", "the walk reaches nested settings")
	for page, heads := range map[string][]string{
		"CONFIGURATION.md":    {"setting"},
		"CONFIGURATION.ru.md": readRussianData(t).SettingsTableHeads,
	} {
		t.Run(page, func(t *testing.T) {
			md, err := readDoc(page)
			require.NoError(t, err)
			rows, err := settingsTable(md, heads...)
			require.NoError(t, err)
			require.NotEmpty(t, rows, "docs/%s has a settings table headed %v", page, heads)
			documented := map[string]bool{}
			for _, r := range rows {
				documented[r] = true
			}
			for p := range schema {
				assert.True(t, documented[p], "the setting %s of openapi/config-values.yaml is not in the table of docs/%s", p, page)
			}
			for p := range documented {
				assert.True(t, schema[p], "docs/%s documents the setting %s, which openapi/config-values.yaml does not have", page, p)
			}
		})
	}
}
