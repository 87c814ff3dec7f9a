// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package crd_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

// beforeBoundsCRD is the CRD as shipped before the input bounds (issue 16 part 5), verbatim.
const beforeBoundsCRD = "testdata/servicewithhealthchecks-before-bounds.yaml"

// A resource admitted before a rule existed must stay editable as long as the offending field
// is left alone, or the module's own upgrade would strand it: labels, the selector and the
// status (the controller's writes) must still go through. The API server's CRD validation
// ratcheting (GA and locked on since Kubernetes 1.33, beta and on by default since 1.30) does
// this; this test shows it on the real API server with resources written under the old schema.
func TestResourcesAdmittedBeforeTheBoundsStayEditableWhileTheOffendingFieldIsUnchanged(t *testing.T) {
	old := controlplane.StartForTest(t, controlplane.Options{SkipModuleCRDs: true, ExtraCRDPaths: []string{beforeBoundsCRD}})
	ns := old.CreateNamespaceForTest(t, "ratchet")
	ctx := t.Context()

	cases := map[string]struct {
		// spec is admitted by the old CRD and refused by the new one with want.
		spec string
		// changed changes the offending field to another value the new rule refuses.
		changed string
		want    string
	}{
		"an appProtocol that is not a qualified name": {
			spec:    "ports:\n- {port: 80, appProtocol: 'my protocol'}\nselector: {app: a}\n",
			changed: "ports:\n- {port: 80, appProtocol: 'my other protocol'}\nselector: {app: a}\n",
			want:    "appProtocol must be a qualified name",
		},
		"an http.path the probe cannot send": {
			spec:    withProbe(httpProbe("path: /%zz")),
			changed: withProbe(httpProbe("path: /%yy")),
			want:    "http.path must be a request path the probe can send",
		},
		"a probe that needs ten hours to fail": {
			spec:    validPorts + "healthcheck:\n  periodSeconds: 3600\n  probes:\n  - mode: TCP\n    failureThreshold: 10\n    tcp: {targetPort: 8080}\n",
			changed: validPorts + "healthcheck:\n  periodSeconds: 3600\n  probes:\n  - mode: TCP\n    failureThreshold: 11\n    tcp: {targetPort: 8080}\n",
			want:    "a probe must be able to change its verdict within an hour",
		},
		"a CA certificate of 64 KiB": {
			spec:    withProbe(httpsProbe(fmt.Sprintf("caCert: %q", pemOfLength(65536)))),
			changed: withProbe(httpsProbe(fmt.Sprintf("caCert: %q", pemOfLength(65535)))),
			want:    "Too long: may not be more than 16384",
		},
		"HTTP headers of 32 times 4 KiB": {
			spec:    withProbe(httpProbe("httpHeaders: " + headers(32, 4096))),
			changed: withProbe(httpProbe("httpHeaders: " + headers(31, 4096))),
			want:    "http.httpHeaders may hold at most 8192 characters",
		},
	}

	names := map[string]string{}
	i := 0
	for name, tc := range cases {
		i++
		objName := "old-" + string(rune('a'+i))
		names[name] = objName
		require.NoError(t, old.Client.Create(ctx, object(t, ns, objName, tc.spec)), "the old CRD admits %s", name)
	}

	installCRD(t, old, filepath.Join(repoRoot(t), "crds", "servicewithhealthchecks.yaml"))
	// The new schema takes a moment to serve: poll until it refuses a new resource of each case.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for name, tc := range cases {
			err := old.Client.Create(ctx, object(t, ns, "fresh", tc.spec), client.DryRunAll)
			if assert.Error(c, err, "the new CRD refuses a new resource with %s", name) {
				assert.Contains(c, err.Error(), tc.want)
			}
		}
	}, time.Minute, 200*time.Millisecond)

	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			key := keyOf(ns, names[name])
			got := fetch(t, old, key)
			before, _, _ := unstructured.NestedFieldCopy(got.Object, "spec")

			// Labels and a selector change leave the offending field as it is: admitted.
			got.SetLabels(map[string]string{"edited": "yes"})
			require.NoError(t, unstructured.SetNestedStringMap(got.Object, map[string]string{"app": "b"}, "spec", "selector"))
			require.NoError(t, old.Client.Update(t.Context(), got), "an edit that leaves the offending field unchanged is admitted")
			got = fetch(t, old, key)
			after, _, _ := unstructured.NestedFieldCopy(got.Object, "spec")
			delete(before.(map[string]any), "selector")
			delete(after.(map[string]any), "selector")
			assert.Equal(t, before, after, "the offending field is kept as it was")

			// The controller's status writes are admitted too.
			require.NoError(t, unstructured.SetNestedField(got.Object, "1/1", "status", "readySummary"))
			require.NoError(t, old.Client.Status().Update(t.Context(), got), "a status write is admitted")

			// Changing the offending field to another refused value is refused.
			changed := object(t, ns, names[name], tc.changed)
			changed.SetResourceVersion(fetch(t, old, key).GetResourceVersion())
			err := old.Client.Update(t.Context(), changed)
			require.Error(t, err, "a change of the offending field meets the new rule")
			assert.Contains(t, err.Error(), tc.want)
		})
	}

	t.Run("changing another probe re-checks every probe, since the probe list is atomic", func(t *testing.T) {
		key := keyOf(ns, names["an http.path the probe cannot send"])
		got := fetch(t, old, key)
		probes, _, err := unstructured.NestedSlice(got.Object, "spec", "healthcheck", "probes")
		require.NoError(t, err)
		probes = append(probes, map[string]any{"mode": "TCP", "tcp": map[string]any{"targetPort": int64(9090)}})
		require.NoError(t, unstructured.SetNestedSlice(got.Object, probes, "spec", "healthcheck", "probes"))
		err = old.Client.Update(t.Context(), got)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "http.path must be a request path the probe can send")
	})

	t.Run("the EndpointSlice API refuses the old appProtocol, so agents cannot publish it as it is", func(t *testing.T) {
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: "old-appprotocol"},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Port: ptr.To[int32](80), AppProtocol: ptr.To("my protocol")}},
		}
		err := old.Client.Create(t.Context(), slice, client.DryRunAll)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "appProtocol")
		slice.Ports[0].AppProtocol = ptr.To("http")
		require.NoError(t, old.Client.Create(t.Context(), slice, client.DryRunAll), "the same slice with a qualified name is admitted")
	})
}

func fetch(t *testing.T, e *controlplane.Env, key client.ObjectKey) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("ServiceWithHealthchecks"))
	require.NoError(t, e.Client.Get(t.Context(), key, u))
	return u
}

// installCRD replaces the CRD of the same name with the one in file.
func installCRD(t *testing.T, e *controlplane.Env, file string) {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	want := &unstructured.Unstructured{}
	require.NoError(t, yaml.Unmarshal(b, &want.Object))
	cur := &unstructured.Unstructured{}
	cur.SetGroupVersionKind(want.GroupVersionKind())
	require.NoError(t, e.Client.Get(t.Context(), client.ObjectKey{Name: want.GetName()}, cur))
	cur.Object["spec"] = want.Object["spec"]
	require.NoError(t, e.Client.Update(t.Context(), cur), "installing %s", file)
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	require.NoError(t, err)
	return root
}
