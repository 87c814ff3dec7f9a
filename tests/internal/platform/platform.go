// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package platform goes from a ModuleConfig to the values the chart renders with, the steps
// Deckhouse takes (development/PACKAGING.md, "From a ModuleConfig to running"): the ModuleConfig
// must enable the module with settings version 1; spec.settings are validated against
// openapi/config-values.yaml and get its defaults; the module's values (settings, internal values,
// the platform's registry values) and the global values are assembled; the module's
// OnBeforeHelm hooks run in their order on module-sdk's patchable values, their JSON patches
// applied; the result is validated against openapi/values.yaml. The hooks that read snapshots
// get them through module-sdk's own test mocks, with the objects passed through the hooks' real
// jq filters.
package platform

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/deckhouse/deckhouse/pkg/log"
	"github.com/deckhouse/module-sdk/pkg"
	"github.com/deckhouse/module-sdk/pkg/jq"
	patchablevalues "github.com/deckhouse/module-sdk/pkg/patchable-values"
	"github.com/deckhouse/module-sdk/testing/mock"
	jsonpatch "github.com/evanphx/json-patch/v5"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"
	"sigs.k8s.io/yaml"

	"github.com/deckhouse/service-with-healthchecks/hooks/credentials"
	"github.com/deckhouse/service-with-healthchecks/hooks/settings"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// ModuleConfig is the part of a deckhouse.io/v1alpha1 ModuleConfig the platform reads.
type ModuleConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Enabled  *bool          `json:"enabled"`
		Version  int            `json:"version"`
		Settings map[string]any `json:"settings"`
	} `json:"spec"`
}

// ErrNotEnabled is returned for a ModuleConfig that does not enable the module: nothing renders.
var ErrNotEnabled = errors.New("the ModuleConfig does not enable the module: nothing renders")

// Cluster is what the hooks' snapshots hold: the ServiceWithHealthchecks resources and the
// credential Secrets, as typed objects with their TypeMeta set.
type Cluster struct {
	Resources []runtime.Object
	Secrets   []runtime.Object
}

// ParseModuleConfig parses a ModuleConfig from YAML.
func ParseModuleConfig(data []byte) (ModuleConfig, error) {
	var mc ModuleConfig
	if err := yaml.UnmarshalStrict(data, &mc, yaml.DisallowUnknownFields); err != nil {
		return mc, fmt.Errorf("parsing the ModuleConfig: %w", err)
	}
	return mc, nil
}

var yamlFence = regexp.MustCompile("(?ms)^```yaml\n(.*?)^```")

// ModuleConfigsIn are the ModuleConfig examples of a markdown page (its ```yaml blocks of that
// kind), in page order.
func ModuleConfigsIn(markdown []byte) ([]ModuleConfig, error) {
	var out []ModuleConfig
	for _, m := range yamlFence.FindAllSubmatch(markdown, -1) {
		var head struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(m[1], &head); err != nil || head.Kind != "ModuleConfig" {
			continue
		}
		mc, err := ParseModuleConfig(m[1])
		if err != nil {
			return nil, err
		}
		out = append(out, mc)
	}
	return out, nil
}

// Values returns the values tree (global and the module's key) and the render context for a
// ModuleConfig, with the platform's side (enabled modules, nodes, delivery) from set; set's own
// Settings and Internal are ignored: the ModuleConfig and the hooks decide them.
func Values(t *testing.T, mc ModuleConfig, set bundle.ValueSet, cluster Cluster) (map[string]any, map[string]any, error) {
	t.Helper()
	if mc.APIVersion != "deckhouse.io/v1alpha1" || mc.Kind != "ModuleConfig" {
		return nil, nil, fmt.Errorf("not a deckhouse.io/v1alpha1 ModuleConfig: %s %s", mc.APIVersion, mc.Kind)
	}
	if mc.Metadata.Name != bundle.ModuleName {
		return nil, nil, fmt.Errorf("the ModuleConfig is named %q; the module reads only %q", mc.Metadata.Name, bundle.ModuleName)
	}
	if mc.Spec.Enabled == nil || !*mc.Spec.Enabled {
		return nil, nil, ErrNotEnabled
	}
	settingsValues := mc.Spec.Settings
	if settingsValues == nil {
		settingsValues = map[string]any{}
	}
	if len(mc.Spec.Settings) > 0 && mc.Spec.Version != 1 {
		return nil, nil, fmt.Errorf("spec.version is %d; the settings schema is version 1", mc.Spec.Version)
	}
	if err := validateAgainst("config-values.yaml", settingsValues); err != nil {
		return nil, nil, fmt.Errorf("spec.settings: %w", err)
	}
	configSchema, err := bundle.SchemaMap("config-values.yaml")
	if err != nil {
		return nil, nil, err
	}
	settingsCopy, err := deepCopy(settingsValues)
	if err != nil {
		return nil, nil, err
	}
	bundle.ApplyDefaults(configSchema, settingsCopy)

	set.Settings, set.Internal = settingsCopy, nil
	values, err := set.Values()
	if err != nil {
		return nil, nil, err
	}
	if values, err = runHooks(t, values, cluster); err != nil {
		return nil, nil, err
	}
	if err := validateAgainst("values.yaml", values[bundle.ValuesKey].(map[string]any)); err != nil {
		return nil, nil, fmt.Errorf("the module's values after the hooks: %w", err)
	}
	return values, set.Context(), nil
}

func validateAgainst(schema string, obj map[string]any) error {
	s, err := bundle.Schema(schema)
	if err != nil {
		return err
	}
	res := validate.NewSchemaValidator(s, nil, "", strfmt.Default).Validate(obj)
	if res.IsValid() {
		return nil
	}
	msgs := make([]string, 0, len(res.Errors))
	for _, e := range res.Errors {
		msgs = append(msgs, e.Error())
	}
	sort.Strings(msgs)
	return fmt.Errorf("not valid against openapi/%s: %s", schema, strings.Join(msgs, "; "))
}

// hook is one OnBeforeHelm hook of the module.
type hook struct {
	name   string
	order  uint
	handle func(context.Context, *pkg.HookInput) error
}

// runHooks runs the module's OnBeforeHelm hooks in their order and applies their patches.
func runHooks(t *testing.T, values map[string]any, cluster Cluster) (map[string]any, error) {
	t.Helper()
	hooks := []hook{
		{"settings/settings", settings.Config.OnBeforeHelm.Order, settings.Handle},
		{"credentials/credentials", credentials.Config.OnBeforeHelm.Order, credentials.Handle},
	}
	sort.SliceStable(hooks, func(i, j int) bool { return hooks[i].order < hooks[j].order })
	snaps, err := snapshots(t, cluster)
	if err != nil {
		return nil, err
	}
	for _, h := range hooks {
		pv, err := patchablevalues.NewPatchableValues(values)
		if err != nil {
			return nil, fmt.Errorf("hook %s: values: %w", h.name, err)
		}
		mc := mock.NewMetricsCollectorMock(t)
		mc.ExpireMock.Optional().Return()
		mc.SetMock.Optional().Return()
		input := &pkg.HookInput{Snapshots: snaps, Values: pv, MetricsCollector: mc, Logger: log.NewNop()}
		if err := h.handle(t.Context(), input); err != nil {
			return nil, fmt.Errorf("hook %s: %w", h.name, err)
		}
		if values, err = applyPatches(values, pv); err != nil {
			return nil, fmt.Errorf("hook %s: %w", h.name, err)
		}
	}
	return values, nil
}

// snapshots serves the credentials hook's bindings: each object through the binding's jq filter.
func snapshots(t *testing.T, cluster Cluster) (pkg.Snapshots, error) {
	t.Helper()
	filtered := map[string][]pkg.Snapshot{}
	for name, in := range map[string]struct {
		filter  string
		objects []runtime.Object
	}{
		credentials.SnapshotResources: {credentials.ResourcesFilter, cluster.Resources},
		credentials.SnapshotSecrets:   {credentials.SecretsFilter, cluster.Secrets},
	} {
		q, err := jq.NewQuery(in.filter)
		if err != nil {
			return nil, fmt.Errorf("jq filter of %s: %w", name, err)
		}
		filtered[name] = []pkg.Snapshot{}
		for _, obj := range in.objects {
			res, err := q.FilterObject(t.Context(), obj)
			if err != nil {
				return nil, fmt.Errorf("filtering %s: %w", name, err)
			}
			text := res.String()
			s := mock.NewSnapshotMock(t)
			s.UnmarshalToMock.Optional().Set(func(v any) error { return json.Unmarshal([]byte(text), v) })
			s.StringMock.Optional().Return(text)
			filtered[name] = append(filtered[name], s)
		}
	}
	snaps := mock.NewSnapshotsMock(t)
	snaps.GetMock.Optional().Set(func(key string) []pkg.Snapshot { return filtered[key] })
	return snaps, nil
}

// applyPatches applies a hook's JSON patches to the values, as the platform does.
func applyPatches(values map[string]any, pv *patchablevalues.PatchableValues) (map[string]any, error) {
	ops := pv.GetPatches()
	if len(ops) == 0 {
		return values, nil
	}
	patchJSON, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("encoding patches: %w", err)
	}
	patch, err := jsonpatch.DecodePatch(patchJSON)
	if err != nil {
		return nil, fmt.Errorf("decoding patches %s: %w", patchJSON, err)
	}
	doc, err := json.Marshal(values)
	if err != nil {
		return nil, fmt.Errorf("encoding values: %w", err)
	}
	opts := jsonpatch.NewApplyOptions()
	opts.EnsurePathExistsOnAdd = true
	patched, err := patch.ApplyWithOptions(doc, opts)
	if err != nil {
		return nil, fmt.Errorf("applying patches %s: %w", patchJSON, err)
	}
	out := map[string]any{}
	dec := json.NewDecoder(bytes.NewReader(patched))
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("decoding patched values: %w", err)
	}
	return out, nil
}

func deepCopy(in map[string]any) (map[string]any, error) {
	data, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	return out, json.Unmarshal(data, &out)
}
