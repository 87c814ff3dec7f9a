// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package bundle loads the module bundle for tests: it renders the chart with Helm's Go engine
// from values built the way Deckhouse builds them (settings with the schema's defaults applied,
// plus the internal values the hooks write), and reads the OpenAPI settings schemas.
package bundle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"sigs.k8s.io/yaml"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

// Names the chart uses.
const (
	// ModuleName is the module's name (and the chart's).
	ModuleName = "service-with-healthchecks"
	// ValuesKey is the key of the module's values (the module name in camelCase).
	ValuesKey = "serviceWithHealthchecks"
	// Namespace is the module namespace.
	Namespace = wellknown.Namespace
	// MonitoringNamespace is where the platform's Prometheus and the PodMonitors live.
	MonitoringNamespace = "d8-monitoring"
	// ControllerElectionLease is the controller's leader-election Lease in the module namespace
	// (images/controller/internal/controller.LeaderElectionID), the only Lease its policy lets it
	// write.
	ControllerElectionLease = "service-with-healthchecks-controller"
)

// Root is the repository root (the folder with go.work).
func Root() (string, error) {
	return controlplane.RepoRoot()
}

// ReadYAML reads a YAML file under the repository root into a generic value.
func ReadYAML(rel string) (map[string]any, error) {
	root, err := Root()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", rel, err)
	}
	out := map[string]any{}
	if err := yaml.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", rel, err)
	}
	return out, nil
}

// SchemaMap is the schema of openapi/<name> as a generic value. For values.yaml, the
// x-extend'ed schema's properties are merged in, as Deckhouse does.
func SchemaMap(name string) (map[string]any, error) {
	s, err := ReadYAML(filepath.Join("openapi", name))
	if err != nil {
		return nil, err
	}
	ext, ok := s["x-extend"].(map[string]any)
	if !ok {
		return s, nil
	}
	base, err := SchemaMap(fmt.Sprint(ext["schema"]))
	if err != nil {
		return nil, err
	}
	delete(s, "x-extend")
	props, _ := s["properties"].(map[string]any)
	if props == nil {
		props = map[string]any{}
	}
	baseProps, _ := base["properties"].(map[string]any)
	for k, v := range baseProps {
		if _, exists := props[k]; !exists {
			props[k] = v
		}
	}
	s["properties"] = props
	return s, nil
}

// Schema is SchemaMap as an OpenAPI schema for a validator.
func Schema(name string) (*spec.Schema, error) {
	m, err := SchemaMap(name)
	if err != nil {
		return nil, err
	}
	data, err := yaml.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encoding schema %s: %w", name, err)
	}
	s := &spec.Schema{}
	if err := yaml.Unmarshal(data, s); err != nil {
		return nil, fmt.Errorf("decoding schema %s: %w", name, err)
	}
	return s, nil
}

// ApplyDefaults fills obj with the schema's defaults the way the platform does: a missing
// property with a default gets it, and objects (given or defaulted) are descended into.
func ApplyDefaults(schema map[string]any, obj map[string]any) {
	props, _ := schema["properties"].(map[string]any)
	for name, raw := range props {
		prop, _ := raw.(map[string]any)
		if prop == nil {
			continue
		}
		if _, ok := obj[name]; !ok {
			if d, ok := prop["default"]; ok {
				obj[name] = deepCopy(d)
			}
		}
		if child, ok := obj[name].(map[string]any); ok {
			ApplyDefaults(prop, child)
		}
	}
}

func deepCopy(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, v := range t {
			out[k] = deepCopy(v)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, v := range t {
			out[i] = deepCopy(v)
		}
		return out
	default:
		return v
	}
}

// Render renders the chart with the given values (the whole tree: global and the module's key)
// and returns every object, in file order.
func Render(values map[string]any) ([]*unstructured.Unstructured, error) {
	return RenderContext(values, nil)
}

// RenderContext is Render with further top-level keys of the render context beside .Values,
// .Chart and the rest (the platform's .Module).
func RenderContext(values, extra map[string]any) ([]*unstructured.Unstructured, error) {
	return RenderWithFiles(values, extra, nil)
}

// RenderWithFiles is RenderContext with the chart's files (what .Files reads, such as
// monitoring/prometheus-rules/*.yaml) replaced: a path mapped to nil is removed, any other is
// set, the module's own files stay as they are on disk.
func RenderWithFiles(values, extra map[string]any, files map[string][]byte) ([]*unstructured.Unstructured, error) {
	root, err := Root()
	if err != nil {
		return nil, err
	}
	return RenderDir(root, values, extra, files)
}

// RenderDir is RenderWithFiles of the chart in dir (a copy of the bundle, say) instead of the
// repository root.
func RenderDir(dir string, values, extra map[string]any, files map[string][]byte) ([]*unstructured.Unstructured, error) {
	chrt, err := loader.LoadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("loading the chart: %w", err)
	}
	if len(files) > 0 {
		kept := chrt.Files[:0]
		for _, f := range chrt.Files {
			if _, replaced := files[f.Name]; !replaced {
				kept = append(kept, f)
			}
		}
		chrt.Files = kept
		for name, data := range files {
			if data != nil {
				chrt.Files = append(chrt.Files, &chart.File{Name: name, Data: data})
			}
		}
	}
	renderValues, err := chartutil.ToRenderValues(chrt, values, chartutil.ReleaseOptions{
		Name: ModuleName, Namespace: Namespace, IsInstall: true,
	}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, fmt.Errorf("building render values: %w", err)
	}
	if err := addRenderContext(chrt, extra); err != nil {
		return nil, err
	}
	rendered, err := engine.Engine{Strict: true}.Render(chrt, renderValues)
	if err != nil {
		return nil, fmt.Errorf("rendering: %w", err)
	}
	names := make([]string, 0, len(rendered))
	for name := range rendered {
		names = append(names, name)
	}
	sort.Strings(names)
	var objs []*unstructured.Unstructured
	for _, name := range names {
		if strings.HasSuffix(name, ".tpl") || strings.HasSuffix(name, contextTemplate) || strings.TrimSpace(rendered[name]) == "" {
			continue
		}
		got, err := decode(rendered[name])
		if err != nil {
			return nil, fmt.Errorf("decoding %s: %w", name, err)
		}
		objs = append(objs, got...)
	}
	return objs, nil
}

// contextTemplate is the name of the template addRenderContext adds: the deepest path and last
// in order, so Helm renders it before every template of the chart.
const contextTemplate = "templates/zz-render-context/zz/zz-render-context.yaml"

// addRenderContext puts extra top-level keys into the render context, as nelm passes .Module
// beside .Values. Helm's Go engine builds each chart's context from fixed keys (Chart, Files,
// Release, Capabilities, Values) and shares that one map among the chart's templates, so a
// template rendered first that sets the keys on it makes them visible to all the others. The
// template renders nothing and lives only in the loaded chart, never in the module.
func addRenderContext(chrt *chart.Chart, extra map[string]any) error {
	if len(extra) == 0 {
		return nil
	}
	for k := range extra {
		switch k {
		case "Chart", "Files", "Release", "Capabilities", "Values", "Subcharts", "Template":
			return fmt.Errorf("render context key %q is Helm's own", k)
		}
	}
	data, err := json.Marshal(extra)
	if err != nil {
		return fmt.Errorf("encoding the render context: %w", err)
	}
	tpl := fmt.Sprintf("{{- range $k, $v := fromJson %s }}{{- $_ := set $ $k $v }}{{- end }}", strconv.Quote(string(data)))
	chrt.Templates = append(chrt.Templates, &chart.File{Name: contextTemplate, Data: []byte(tpl)})
	return nil
}

func decode(manifest string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewBufferString(manifest), 4096)
	var out []*unstructured.Unstructured
	for {
		obj := map[string]any{}
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(obj) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: obj})
	}
}

// FromGeneric converts a generic value into a typed one through JSON, rejecting unknown fields.
func FromGeneric(in any, out any) error {
	data, err := yaml.Marshal(in)
	if err != nil {
		return fmt.Errorf("encoding: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, out); err != nil {
		return fmt.Errorf("decoding into %T: %w", out, err)
	}
	return nil
}
