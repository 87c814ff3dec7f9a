// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package docs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// rejectedMarker, as a comment in an example, says the API server must reject it with a message
// containing the rest of the line (for examples of what not to write).
const rejectedMarker = "# rejected:"

// notApplied lists kinds an example may show that this API server does not serve; they are
// checked elsewhere (ModuleConfig against openapi/config-values.yaml in moduleconfig_test.go).
var notApplied = map[string]bool{"ModuleConfig": true}

// example is one resource of a yaml block.
type example struct {
	where        string
	obj          *unstructured.Unstructured
	wantRejected string
}

// examplesOf splits the yaml blocks of a page into resources; fragments without apiVersion and
// kind (a part of a spec shown for explanation) are not resources and are skipped.
func examplesOf(name string, md []byte) ([]example, error) {
	blocks, err := yamlBlocks(md)
	if err != nil {
		return nil, fmt.Errorf("docs/%s: %w", name, err)
	}
	var out []example
	for _, b := range blocks {
		dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(b.Text), 4096)
		for i := 0; ; i++ {
			var m map[string]any
			if err := dec.Decode(&m); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return nil, fmt.Errorf("docs/%s:%d: document %d is not valid YAML: %w", name, b.Line, i, err)
			}
			if m == nil || m["apiVersion"] == nil || m["kind"] == nil {
				continue
			}
			ex := example{where: fmt.Sprintf("%s:%d#%d", name, b.Line, i), obj: &unstructured.Unstructured{Object: m}}
			ex.wantRejected = rejectedReason(b.Text, i)
			out = append(out, ex)
		}
	}
	return out, nil
}

// rejectedReason finds the rejected marker in the i-th document of a block.
func rejectedReason(block string, i int) string {
	docs := strings.Split("\n"+block, "\n---")
	if i >= len(docs) {
		return ""
	}
	for _, line := range strings.Split(docs[i], "\n") {
		if _, after, ok := strings.Cut(line, rejectedMarker); ok {
			return strings.TrimSpace(after)
		}
	}
	return ""
}

// installCredentialPolicy applies the chart's ValidatingAdmissionPolicy for credential Secrets
// and waits until it is in force, so Secret examples meet the same admission as in a cluster.
func installCredentialPolicy(t *testing.T) {
	t.Helper()
	values, err := bundle.ValueSets()[bundle.SetDefaults].Values()
	require.NoError(t, err)
	rendered, err := bundle.Render(values)
	require.NoError(t, err)
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		found := bundle.Objects(rendered).OfKind(kind)
		require.NotEmpty(t, found, "the chart renders a %s", kind)
		for _, o := range found {
			err := env.Client.Create(t.Context(), o.DeepCopy())
			if !apierrors.IsAlreadyExists(err) {
				require.NoError(t, err, "creating %s %s", kind, o.GetName())
			}
		}
	}
	ns := env.CreateNamespaceForTest(t, "policy")
	bad := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "no-user"},
		Type:       wellknown.SecretTypePostgreSQLCredentials,
		StringData: map[string]string{"password": "x"},
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		err := env.Client.Create(t.Context(), bad.DeepCopy(), client.DryRunAll)
		assert.True(c, apierrors.IsInvalid(err), "want the policy to reject a Secret without user, got %v", err)
	}, time.Minute, 200*time.Millisecond)
}

func TestEveryResourceExampleInTheDocsIsAcceptedByTheAPIServer(t *testing.T) {
	installCredentialPolicy(t)
	names, err := markdownFiles()
	require.NoError(t, err)

	total, resources := 0, 0
	for _, name := range names {
		md, err := readDoc(name)
		require.NoError(t, err)
		examples, err := examplesOf(name, md)
		require.NoError(t, err)
		if len(examples) == 0 {
			continue
		}
		t.Run(name, func(t *testing.T) {
			ns := env.CreateNamespaceForTest(t, "docs")
			for _, ex := range examples {
				total++
				if notApplied[ex.obj.GetKind()] {
					continue
				}
				resources++
				t.Run(ex.where, func(t *testing.T) {
					obj := ex.obj.DeepCopy()
					mapping, err := env.Client.RESTMapper().RESTMapping(obj.GroupVersionKind().GroupKind(), obj.GroupVersionKind().Version)
					require.NoError(t, err, "%s: kind %s is not served; add it to notApplied only if another test checks it", ex.where, obj.GetKind())
					if mapping.Scope.Name() == "namespace" {
						obj.SetNamespace(ns)
					}
					err = env.Client.Create(t.Context(), obj, client.DryRunAll)
					if ex.wantRejected != "" {
						require.Error(t, err, "%s is marked rejected but the API server accepted it", ex.where)
						assert.Contains(t, err.Error(), ex.wantRejected)
						return
					}
					require.NoError(t, err, "%s %s/%s was rejected", obj.GetKind(), obj.GetNamespace(), obj.GetName())
				})
			}
		})
	}
	// The test must have something to check: the user docs hold resource examples.
	assert.Greater(t, resources, 10, "resource examples applied (of %d found)", total)
}

func TestTheExampleParserFindsResourcesAndMarkers(t *testing.T) {
	md := []byte("text\n```yaml\napiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\n" +
		"# rejected: nope\napiVersion: v1\nkind: Secret\nmetadata: {name: b}\n```\n" +
		"```yaml\nspec:\n  ports: []\n```\n```sh\nkubectl get swh\n```\n")
	got, err := examplesOf("x.md", md)
	require.NoError(t, err)
	require.Len(t, got, 2, "the fragment without kind is skipped")
	assert.Equal(t, "Service", got[0].obj.GetKind())
	assert.Empty(t, got[0].wantRejected)
	assert.Equal(t, "Secret", got[1].obj.GetKind())
	assert.Equal(t, "nope", got[1].wantRejected)
	assert.Equal(t, "x.md:2#1", got[1].where)
	_, err = examplesOf("y.md", bytes.Repeat([]byte("```yaml\n"), 1))
	assert.Error(t, err, "an unclosed fence is an error")
}
