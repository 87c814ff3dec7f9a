// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package crd_test

import (
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// objectWithSpec builds a ServiceWithHealthchecks from a spec given as values, for strings that
// YAML would make hard to write (control characters, exact lengths).
func objectWithSpec(ns, name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "ServiceWithHealthchecks",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec":       spec,
	}}
}

// The API server validates appProtocol in a Service and an EndpointSlice as a qualified name; a
// resource whose appProtocol they refuse never gets its Service or its slices written. So the
// CRD must admit exactly what a Service admits (within its own 256-character bound).
func TestAnAppProtocolIsAdmittedExactlyWhenAServiceAdmitsIt(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "crd-appprotocol")
	candidates := map[string]string{
		"a plain name":                            "http",
		"a name in capitals":                      "HTTP",
		"a name with a domain prefix":             "kubernetes.io/h2c",
		"a name with '_', '.' and '-' inside":     "my_proto.v2-x",
		"a name that starts with '_'":             "_x",
		"a name that ends with '-'":               "x-",
		"an empty value":                          "",
		"a name with a space":                     "my protocol",
		"a name with a colon":                     "h2:c",
		"a name that is not ASCII":                "\u043f\u0440\u043e\u0442\u043e\u043a\u043e\u043b",
		"a prefix and a slash without a name":     "example.com/",
		"a slash without a prefix":                "/x",
		"two slashes":                             "example.com/a/b",
		"a prefix in capitals":                    "Example.com/x",
		"a prefix with '_'":                       "ex_ample.com/x",
		"a prefix with an empty label":            "a..b/x",
		"a prefix that ends with a dot":           "a./x",
		"a name of 63 characters":                 strings.Repeat("a", 63),
		"a name of 64 characters":                 strings.Repeat("a", 64),
		"a prefix of 253 characters and a name":   strings.Repeat("a", 253) + "/x",
		"a prefix of 254 characters and a name":   strings.Repeat("a", 254) + "/x",
		"a 63-character name after a long prefix": strings.Repeat("a", 190) + "/" + strings.Repeat("b", 63),
	}
	var admitted, refused int
	i := 0
	for name, value := range candidates {
		i++
		t.Run(name, func(t *testing.T) {
			require.LessOrEqual(t, len(value), 256, "the CRD bounds appProtocol to 256 characters before any rule")
			swh := objectWithSpec(ns, fmt.Sprintf("proto-%d", i), map[string]any{
				"ports": []any{map[string]any{"port": int64(80), "appProtocol": value}},
			})
			swhErr := env.Client.Create(t.Context(), swh, client.DryRunAll)
			svc := &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("proto-%d", i)},
				Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, AppProtocol: &value}}},
			}
			svcErr := env.Client.Create(t.Context(), svc, client.DryRunAll)

			assert.Equal(t, svcErr == nil, swhErr == nil, "the resource and a Service must agree on %q: resource %v, Service %v", value, swhErr, svcErr)
			assert.Equal(t, len(validation.IsQualifiedName(value)) == 0, swhErr == nil, "the resource must admit %q exactly when it is a qualified name", value)
			if swhErr != nil {
				refused++
				assert.Contains(t, swhErr.Error(), "appProtocol must be a qualified name, as in a Service")
			} else {
				admitted++
			}
		})
	}
	assert.Positive(t, admitted, "some candidates are admitted")
	assert.Positive(t, refused, "some candidates are refused")
}

// The agent builds its request from http.path with url.ParseRequestURI (images/agent/internal/
// prober): a path it cannot parse means the probe never runs. So the CRD must admit exactly the
// paths it can parse.
func TestAnHTTPPathIsAdmittedExactlyWhenTheProbeCanSendIt(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "crd-path")
	candidates := map[string]string{
		"the root":                                 "/",
		"a plain path":                             "/healthz",
		"a valid escape":                           "/a%2Fb",
		"an escaped UTF-8 character":               "/%E2%82%AC",
		"a space, which the probe escapes":         "/health check",
		"a character that is not ASCII":            "/héllo",
		"a fragment mark, which the probe escapes": "/a#b",
		"a query with a broken escape":             "/?q=%zz",
		"a query with a second question mark":      "/a?b?c",
		"an empty query":                           "/a?",
		"a double slash":                           "//a",
		"an escape of non-hex digits":              "/%zz",
		"a lone percent sign":                      "/100%",
		"an escape with one digit":                 "/%4",
		"an escape with one hex and one other":     "/%4g/x",
		"a tab":                                    "/a\tb",
		"a line break":                             "/a\r\nX-Injected: 1",
		"a control character in the query":         "/a?b=\x01",
		"a DEL character":                          "/a\x7f",
	}
	var admitted, refused int
	i := 0
	for name, path := range candidates {
		i++
		t.Run(name, func(t *testing.T) {
			swh := objectWithSpec(ns, fmt.Sprintf("path-%d", i), map[string]any{
				"ports": []any{map[string]any{"port": int64(80)}},
				"healthcheck": map[string]any{"probes": []any{map[string]any{
					"mode": "HTTP",
					"http": map[string]any{"targetPort": int64(8080), "path": path},
				}}},
			})
			err := env.Client.Create(t.Context(), swh, client.DryRunAll)
			_, parseErr := url.ParseRequestURI(path)
			assert.Equal(t, parseErr == nil, err == nil, "the resource must admit %q exactly when the probe can parse it: admission %v, parse %v", path, err, parseErr)
			if err != nil {
				refused++
				assert.Contains(t, err.Error(), "http.path must be a request path the probe can send")
			} else {
				admitted++
			}
		})
	}
	assert.Positive(t, admitted, "some candidates are admitted")
	assert.Positive(t, refused, "some candidates are refused")
}
