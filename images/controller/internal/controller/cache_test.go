// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/childservice"
)

// TestTheCacheKeepsNoManagedFieldsButServicesKeepTheirs proves the cache transform: the slices
// and resources the controller caches carry no managedFields although the API server's
// copies do, while a cached Service keeps its own — the controller's managedFields upgrade reads
// them, and the child Service still ends up owned by the controller's apply.
func TestTheCacheKeepsNoManagedFieldsButServicesKeepTheirs(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "cache")
	run := startController(t, ns, nil)
	swh := newResource(ns, "web", nil)
	create(t, swh)
	nodeName := ns + "-n1"
	node(t, nodeName)
	sl := slice(t, ns, "web", swh.UID, "http", nodeName)

	eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.Contains(c, applyManagers(svc.ManagedFields), childservice.FieldManager, "the child Service is owned by the controller's apply")
	}, "the child Service is created and its ownership upgraded")

	cached := run.mgr.GetCache()
	for _, tc := range []struct {
		name        string
		key         client.ObjectKey
		obj         client.Object
		keepsFields bool
	}{
		{"an EndpointSlice", client.ObjectKeyFromObject(sl), &discoveryv1.EndpointSlice{}, false},
		{"a resource", client.ObjectKeyFromObject(swh), &v1alpha1.ServiceWithHealthchecks{}, false},
		{"the child Service", client.ObjectKey{Namespace: ns, Name: "web"}, &corev1.Service{}, true},
	} {
		live := tc.obj.DeepCopyObject().(client.Object)
		require.NoError(t, env.Client.Get(t.Context(), tc.key, live), tc.name)
		require.NotEmpty(t, live.GetManagedFields(), "the API server's copy of %s has managedFields", tc.name)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			if !assert.NoError(c, cached.Get(t.Context(), tc.key, tc.obj)) {
				return
			}
			if tc.keepsFields {
				assert.NotEmpty(c, tc.obj.GetManagedFields(), "the cached copy of %s keeps its managedFields", tc.name)
			} else {
				assert.Empty(c, tc.obj.GetManagedFields(), "the cached copy of %s has none", tc.name)
			}
		}, wait, tick, tc.name)
	}
}

// applyManagers lists the managers of the apply entries.
func applyManagers(entries []metav1.ManagedFieldsEntry) []string {
	var out []string
	for _, e := range entries {
		if e.Operation == metav1.ManagedFieldsOperationApply {
			out = append(out, e.Manager)
		}
	}
	return out
}
