// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package cluster checks the rendered chart against a real kube-apiserver: every object passes
// server-side dry-run, the RBAC works as the real service accounts, and the admission policy
// rejects malformed credential Secrets. (The kube-rbac-proxy contract is tested with the real
// sidecar in tests/installed.)
package cluster

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

var (
	env *controlplane.Env
	dyn *dynamic.DynamicClient
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	crds, err := bundle.PlatformCRDPaths()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env, err = controlplane.Start(controlplane.Options{ExtraCRDPaths: crds})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	dyn, err = dynamic.NewForConfig(env.Config)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

func render(t *testing.T, set bundle.ValueSet) bundle.Objects {
	t.Helper()
	objs, err := set.Render()
	require.NoError(t, err)
	return objs
}

// ensureNamespace creates a namespace the platform or the user would have (d8-monitoring, the
// users' namespaces), or the module namespace before the chart's own objects are applied.
func ensureNamespace(t *testing.T, name string) {
	t.Helper()
	err := env.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
}

// resourceFor is the dynamic client for an object's kind and namespace.
func resourceFor(obj *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := obj.GroupVersionKind()
	mapping, err := env.Client.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("mapping %s: %w", gvk, err)
	}
	if mapping.Scope.Name() == "namespace" {
		return dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace()), nil
	}
	return dyn.Resource(mapping.Resource), nil
}

// write creates the object, or updates it when it exists, with strict field validation.
// dryRun sends it through every admission and validation step without storing it.
func write(ctx context.Context, obj *unstructured.Unstructured, dryRun bool) error {
	ri, err := resourceFor(obj)
	if err != nil {
		return err
	}
	var dr []string
	if dryRun {
		dr = []string{metav1.DryRunAll}
	}
	obj = obj.DeepCopy()
	existing, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = ri.Create(ctx, obj, metav1.CreateOptions{DryRun: dr, FieldValidation: "Strict"})
	case err == nil:
		obj.SetResourceVersion(existing.GetResourceVersion())
		_, err = ri.Update(ctx, obj, metav1.UpdateOptions{DryRun: dr, FieldValidation: "Strict"})
	}
	if err != nil {
		return fmt.Errorf("%s %s/%s: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// apply writes the rendered objects of the given kinds for real.
func apply(t *testing.T, objs bundle.Objects, kinds ...string) {
	t.Helper()
	for _, kind := range kinds {
		for _, obj := range objs.OfKind(kind) {
			require.NoError(t, write(t.Context(), obj, false))
		}
	}
}
