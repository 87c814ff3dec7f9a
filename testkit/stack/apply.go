// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

// FieldManager is the field manager of the stack's server-side applies.
const FieldManager = "swh-stack"

// Apply server-side applies objects (typed or unstructured). Namespaced objects without a
// namespace go to namespace.
func (s *Stack) Apply(ctx context.Context, namespace string, objs ...client.Object) error {
	for _, obj := range objs {
		u, err := s.toUnstructured(obj)
		if err != nil {
			return err
		}
		if err := s.applyOne(ctx, namespace, u); err != nil {
			return err
		}
	}
	return nil
}

// ApplyYAML server-side applies every object of a multi-document YAML (or JSON) text, in
// order. Namespaced objects without a namespace go to namespace.
func (s *Stack) ApplyYAML(ctx context.Context, namespace string, data []byte) error {
	objs, err := DecodeYAML(data)
	if err != nil {
		return err
	}
	for _, u := range objs {
		if err := s.applyOne(ctx, namespace, u); err != nil {
			return err
		}
	}
	return nil
}

// ApplyFile is ApplyYAML of a file; a relative path is taken from the repository root (so
// "docs/examples/db.yaml" works from any package).
func (s *Stack) ApplyFile(ctx context.Context, namespace, path string) error {
	if !filepath.IsAbs(path) {
		root, err := controlplane.RepoRoot()
		if err != nil {
			return err
		}
		path = filepath.Join(root, path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	if err := s.ApplyYAML(ctx, namespace, data); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// DecodeYAML splits a multi-document YAML (or JSON) text into objects, skipping empty
// documents.
func DecodeYAML(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for i := 1; ; i++ {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decoding YAML document %d: %w", i, err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

func (s *Stack) toUnstructured(obj client.Object) (*unstructured.Unstructured, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return u.DeepCopy(), nil
	}
	gvk, err := apiutil.GVKForObject(obj, s.client.Scheme())
	if err != nil {
		return nil, fmt.Errorf("finding the kind of %T: %w", obj, err)
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("converting %T: %w", obj, err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(gvk)
	return u, nil
}

func (s *Stack) applyOne(ctx context.Context, namespace string, u *unstructured.Unstructured) error {
	u = u.DeepCopy()
	// Fields a server-side apply must not carry.
	u.SetManagedFields(nil)
	u.SetResourceVersion("")
	u.SetUID("")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u.Object, "status")
	namespaced, err := s.client.IsObjectNamespaced(u)
	if err != nil {
		return fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
	}
	if namespaced && u.GetNamespace() == "" {
		u.SetNamespace(namespace)
	}
	if err := s.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	return nil
}
