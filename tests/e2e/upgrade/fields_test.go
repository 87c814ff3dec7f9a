// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package upgrade_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// TestRollbackPrunesAFieldOfTheLaterReleaseAndAWriteDropsIt confirms, on the real API server,
// what a rollback does to a field only the later release's CRD has (development/RELEASING.md,
// "Upgrade and rollback"). The later CRD is HEAD's with one more spec field; the earlier is
// HEAD's. With the earlier CRD applied back:
//
//   - a stored object is read without the field (pruned on read: the earlier programs never
//     see it), yet it stays in etcd: with the later CRD applied again, and no write between,
//     the field is back;
//   - a write carrying the field is refused with strict field validation and, without it,
//     accepted with the field dropped;
//   - any write of the object under the earlier CRD (the earlier controller's status update
//     is one) stores it without the field: it is gone for good, also after the next upgrade.
func TestRollbackPrunesAFieldOfTheLaterReleaseAndAWriteDropsIt(t *testing.T) {
	cluster.SkipUnlessIsolated(t)
	root, err := bundle.Root()
	require.NoError(t, err)
	earlier := filepath.Join(root, "crds", crdFile)
	later := laterCRD(t, earlier)
	env := controlplane.StartForTest(t, controlplane.Options{SkipModuleCRDs: true, ExtraCRDPaths: []string{later}})
	ctx := t.Context()
	ns := env.CreateNamespaceForTest(t, "fields")
	c := env.Client

	data, err := os.ReadFile(filepath.Join(root, exampleFile))
	require.NoError(t, err)
	objs, err := stack.DecodeYAML(data)
	require.NoError(t, err)
	obj := objs[0]
	obj.SetNamespace(ns)
	require.NoError(t, unstructured.SetNestedField(obj.Object, "on", "spec", unknownField))
	require.NoError(t, c.Create(ctx, obj, client.FieldValidation("Strict")), "the later CRD knows the field")
	key := client.ObjectKeyFromObject(obj)
	requireField(t, c, key, true, "stored under the later CRD")

	applyCRD(t, c, earlier)
	requireField(t, c, key, false, "under the earlier CRD the field is pruned on read")
	applyCRD(t, c, later)
	requireField(t, c, key, true, "not written meanwhile, the object still holds the field in etcd")

	applyCRD(t, c, earlier)
	requireField(t, c, key, false, "pruned on read again")
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(obj.GroupVersionKind())
	require.NoError(t, c.Get(ctx, key, u))
	strict := u.DeepCopy()
	require.NoError(t, unstructured.SetNestedField(strict.Object, "on", "spec", unknownField))
	err = c.Update(ctx, strict, client.DryRunAll, client.FieldValidation("Strict"))
	require.Error(t, err, "strict field validation refuses the field under the earlier CRD")
	assert.Contains(t, err.Error(), `unknown field "spec.`+unknownField+`"`)
	// The earlier controller's write: a status update of the object as it reads it.
	require.NoError(t, unstructured.SetNestedField(u.Object, "written by the earlier controller", "status", "readySummary"))
	require.NoError(t, c.Status().Update(ctx, u))
	applyCRD(t, c, later)
	requireField(t, c, key, false, "a status write under the earlier CRD stored the object without the field")
}

// laterCRD writes a copy of the CRD with one more spec field (unknownField, a string) in every
// version, and returns its path.
func laterCRD(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	crd := map[string]any{}
	require.NoError(t, yaml.Unmarshal(data, &crd))
	versions, _, _ := unstructured.NestedSlice(crd, "spec", "versions")
	require.NotEmpty(t, versions)
	for i, v := range versions {
		vm, _ := v.(map[string]any)
		require.NoError(t, unstructured.SetNestedField(vm, map[string]any{"type": "string"},
			"schema", "openAPIV3Schema", "properties", "spec", "properties", unknownField))
		versions[i] = vm
	}
	require.NoError(t, unstructured.SetNestedSlice(crd, versions, "spec", "versions"))
	out, err := yaml.Marshal(crd)
	require.NoError(t, err)
	later := filepath.Join(t.TempDir(), crdFile)
	require.NoError(t, os.WriteFile(later, out, 0o644))
	return later
}

// applyCRD server-side applies the CRD file, as the platform does on an upgrade.
func applyCRD(t *testing.T, c client.Client, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	objs, err := stack.DecodeYAML(data)
	require.NoError(t, err)
	require.Len(t, objs, 1)
	u := objs[0]
	unstructured.RemoveNestedField(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	require.NoError(t, c.Apply(t.Context(), client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("swh-upgrade-test"), client.ForceOwnership))
}

// requireField waits until the object read from the API server has (or lacks) the field.
func requireField(t *testing.T, c client.Client, key client.ObjectKey, want bool, msg string) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(resourceListGVK.GroupVersion().WithKind("ServiceWithHealthchecks"))
		require.NoError(ct, c.Get(t.Context(), key, u))
		_, found, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", unknownField)
		assert.Equal(ct, want, found, msg)
	}, kit.WaitFor, kit.Poll, msg)
}
