// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package upgrade_test

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// stackFlags are the flags the stack gives every run itself (its kubeconfig, its loopback
// addresses, the node): the chart's values of them are left out.
var stackFlags = []string{"kubeconfig", "metrics-bind-address", "health-probe-bind-address", "node-name"}

// programArgs are a rendered container's arguments without the flags the stack sets itself.
// An argument still referring to the environment ($(VAR)) is an error: the stack runs the
// programs without the pod's environment.
func programArgs(args []string) ([]string, error) {
	var out []string
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "--") && slices.Contains(stackFlags, name) {
			continue
		}
		if strings.Contains(a, "$(") {
			return nil, fmt.Errorf("argument %q refers to the pod's environment", a)
		}
		out = append(out, a)
	}
	return out, nil
}

// chartArgs renders the chart in dir ("" for HEAD's) with values and returns the controller's
// and the agent's arguments (programArgs).
func chartArgs(dir string, values map[string]any) (controller, agent []string, err error) {
	if dir == "" {
		if dir, err = bundle.Root(); err != nil {
			return nil, nil, err
		}
	}
	rendered, err := bundle.RenderDir(dir, values, nil, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("rendering the chart of %s: %w", dir, err)
	}
	objs := bundle.Objects(rendered)
	deploy, err := objs.Deployment(bundle.Namespace, "controller")
	if err != nil {
		return nil, nil, err
	}
	ds, err := objs.DaemonSet(bundle.Namespace, "agent")
	if err != nil {
		return nil, nil, err
	}
	c := bundle.Container(&deploy.Spec.Template.Spec, "controller")
	a := bundle.Container(&ds.Spec.Template.Spec, "agent")
	if c == nil || a == nil {
		return nil, nil, fmt.Errorf("the chart of %s renders no controller or agent container", dir)
	}
	if controller, err = programArgs(c.Args); err != nil {
		return nil, nil, fmt.Errorf("controller: %w", err)
	}
	if agent, err = programArgs(a.Args); err != nil {
		return nil, nil, fmt.Errorf("agent: %w", err)
	}
	return controller, agent, nil
}

// crdSchemas reads a CRD file's openAPIV3Schema of every version, by version name.
func crdSchemas(path string) (map[string]map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Name   string `json:"name"`
				Schema struct {
					OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &crd); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := map[string]map[string]any{}
	for _, v := range crd.Spec.Versions {
		out[v.Name] = v.Schema.OpenAPIV3Schema
	}
	return out, nil
}

// addedFields lists the fields the newer schema has and the older does not, as paths
// ("spec.healthcheck.probes[].grpc"), sorted; a new field's own sub-fields are not listed.
// These are what an older API server prunes and an older program never reads.
func addedFields(older, newer map[string]any) []string {
	var out []string
	var walk func(path string, o, n map[string]any)
	walk = func(path string, o, n map[string]any) {
		if items, ok := n["items"].(map[string]any); ok {
			oItems, _ := o["items"].(map[string]any)
			walk(path+"[]", oItems, items)
		}
		props, _ := n["properties"].(map[string]any)
		oProps, _ := o["properties"].(map[string]any)
		for name, sub := range props {
			p := name
			if path != "" {
				p = path + "." + name
			}
			subMap, _ := sub.(map[string]any)
			oSub, known := oProps[name].(map[string]any)
			if !known {
				out = append(out, p)
				continue
			}
			walk(p, oSub, subMap)
		}
	}
	walk("", older, newer)
	sort.Strings(out)
	return out
}
