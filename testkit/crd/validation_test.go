// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package crd_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

var env *controlplane.Env

func TestMain(m *testing.M) { controlplane.Main(m, controlplane.Options{}, &env) }

// object builds a ServiceWithHealthchecks from the YAML of its spec.
func object(t *testing.T, ns, name, specYAML string) *unstructured.Unstructured {
	t.Helper()
	var spec map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(specYAML), &spec))
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "ServiceWithHealthchecks",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec":       spec,
	}}
	return u
}

const validPorts = `
ports:
- {name: web, port: 80, targetPort: 8080}
selector: {app: demo}
`

func withProbe(probe string) string {
	return validPorts + "healthcheck:\n  probes:\n" + indent(probe, "  ")
}

// httpProbe is an HTTP probe on port 8080 with more fields (YAML lines at the http level).
func httpProbe(fields ...string) string {
	return "- mode: HTTP\n  http:\n    targetPort: 8080\n" + indent(strings.Join(fields, "\n"), "    ")
}

// httpsProbe is httpProbe with scheme HTTPS.
func httpsProbe(fields ...string) string {
	return httpProbe(append([]string{"scheme: HTTPS"}, fields...)...)
}

// pemOfLength is a PEM-armoured string of exactly n characters (n >= 60).
func pemOfLength(n int) string {
	const head, tail = "-----BEGIN CERTIFICATE-----\n", "\n-----END CERTIFICATE-----\n"
	return head + strings.Repeat("A", n-len(head)-len(tail)) + tail
}

// headers is a YAML list of n headers, ... with values of valueLen characters.
func headers(n, valueLen int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf("{name: X-%d, value: %s}", i, strings.Repeat("v", valueLen))
	}
	return "[" + strings.Join(items, ", ") + "]"
}

// headersOfTotalLength is a YAML list of n headers whose names and values have total characters
// together, each value at most 4096 characters.
func headersOfTotalLength(n, total int) string {
	items := make([]string, n)
	left := total
	for i := range items {
		name := fmt.Sprintf("X-%02d", i)
		size := (left - len(name)) / (n - i) // spread what is left over the remaining headers
		if i == n-1 {
			size = left - len(name)
		}
		items[i] = fmt.Sprintf("{name: %s, value: %s}", name, strings.Repeat("v", size))
		left -= len(name) + size
	}
	return "[" + strings.Join(items, ", ") + "]"
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.Trim(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n") + "\n"
}

func TestInvalidResourcesAreRejectedWithAClearMessage(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "crd-invalid")
	tests := map[string]struct {
		name string
		spec string
		want string
	}{
		"a TCP probe that carries an http block names the tcp field": {
			spec: withProbe("- mode: TCP\n  http: {targetPort: 8080, path: /}"),
			want: "a probe with mode: TCP must set tcp: {targetPort: ...} and none of http, postgreSQL, mySQL, grpc",
		},
		"an HTTP probe without its http block": {
			spec: withProbe("- mode: HTTP\n  tcp: {targetPort: 8080}"),
			want: "a probe with mode: HTTP must set http: {targetPort: ...}",
		},
		"a PostgreSQL probe with a second block": {
			spec: withProbe("- mode: PostgreSQL\n  postgreSQL: {targetPort: 5432}\n  tcp: {targetPort: 5432}"),
			want: "a probe with mode: PostgreSQL must set postgreSQL: {targetPort: ...} and none of tcp, http, mySQL, grpc",
		},
		"a PostgreSQL probe with a mySQL block": {
			spec: withProbe("- mode: PostgreSQL\n  postgreSQL: {targetPort: 5432}\n  mySQL: {targetPort: 3306}"),
			want: "a probe with mode: PostgreSQL must set postgreSQL: {targetPort: ...} and none of tcp, http, mySQL, grpc",
		},
		"a MySQL probe without its mySQL block": {
			spec: withProbe("- mode: MySQL\n  postgreSQL: {targetPort: 3306}"),
			want: "a probe with mode: MySQL must set mySQL: {targetPort: ...} and none of tcp, http, postgreSQL, grpc",
		},
		"a MySQL probe with a second block": {
			spec: withProbe("- mode: MySQL\n  mySQL: {targetPort: 3306}\n  tcp: {targetPort: 3306}"),
			want: "a probe with mode: MySQL must set mySQL: {targetPort: ...} and none of tcp, http, postgreSQL, grpc",
		},
		"a TCP probe with a mySQL block": {
			spec: withProbe("- mode: TCP\n  tcp: {targetPort: 3306}\n  mySQL: {targetPort: 3306}"),
			want: "a probe with mode: TCP must set tcp: {targetPort: ...} and none of http, postgreSQL, mySQL, grpc",
		},
		"a MySQL target port of zero": {
			spec: withProbe("- mode: MySQL\n  mySQL: {targetPort: 0}"),
			want: "targetPort must be a port number from 1 to 65535 or a container port name",
		},
		"a MySQL query that is too long": {
			spec: withProbe("- mode: MySQL\n  mySQL: {targetPort: 3306, query: '" + strings.Repeat("x", 4097) + "'}"),
			want: "spec.healthcheck.probes[0].mySQL.query: Too long",
		},
		"a MySQL dbName that is too long": {
			spec: withProbe("- mode: MySQL\n  mySQL: {targetPort: 3306, dbName: '" + strings.Repeat("d", 65) + "'}"),
			want: "spec.healthcheck.probes[0].mySQL.dbName: Too long",
		},
		"a MySQL credential Secret name with spaces": {
			spec: withProbe("- mode: MySQL\n  mySQL: {targetPort: 3306, authSecretName: 'db creds'}"),
			want: "mySQL.authSecretName must be a Secret name",
		},
		"an unknown probe mode": {
			spec: withProbe("- mode: UDP\n  tcp: {targetPort: 8080}"),
			want: `Unsupported value: "UDP": supported values: "HTTP", "TCP", "PostgreSQL", "MySQL", "GRPC"`,
		},
		"a GRPC probe without its grpc block": {
			spec: withProbe("- mode: GRPC\n  tcp: {targetPort: 8080}"),
			want: "a probe with mode: GRPC must set grpc: {targetPort: ...} and none of tcp, http, postgreSQL, mySQL",
		},
		"a GRPC probe with a second block": {
			spec: withProbe("- mode: GRPC\n  grpc: {targetPort: 9090}\n  http: {targetPort: 9090}"),
			want: "a probe with mode: GRPC must set grpc: {targetPort: ...} and none of tcp, http, postgreSQL, mySQL",
		},
		"an HTTP probe that carries a grpc block": {
			spec: withProbe("- mode: HTTP\n  http: {targetPort: 8080}\n  grpc: {targetPort: 9090}"),
			want: "a probe with mode: HTTP must set http: {targetPort: ...} and none of tcp, postgreSQL, mySQL, grpc",
		},
		"a GRPC target port of zero": {
			spec: withProbe("- mode: GRPC\n  grpc: {targetPort: 0}"),
			want: "targetPort must be a port number from 1 to 65535 or a container port name",
		},
		"a GRPC probe without a target port": {
			spec: withProbe("- mode: GRPC\n  grpc: {service: orders}"),
			want: "spec.healthcheck.probes[0].grpc.targetPort: Required value",
		},
		"a gRPC service name with a space": {
			spec: withProbe("- mode: GRPC\n  grpc: {targetPort: 9090, service: 'my service'}"),
			want: "grpc.service must be a gRPC service name such as my.package.Orders",
		},
		"a gRPC service name that starts with a dot": {
			spec: withProbe("- mode: GRPC\n  grpc: {targetPort: 9090, service: .orders}"),
			want: "grpc.service must be a gRPC service name",
		},
		"a gRPC service name longer than 256 characters": {
			spec: withProbe(fmt.Sprintf("- mode: GRPC\n  grpc: {targetPort: 9090, service: %s}", strings.Repeat("s", 257))),
			want: "spec.healthcheck.probes[0].grpc.service: Too long: may not be more than 256",
		},
		"a CA certificate on a gRPC probe without TLS": {
			spec: withProbe("- mode: GRPC\n  grpc: {targetPort: 9090, caCert: \"-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----\"}"),
			want: "grpc.caCert is only used with tls: true",
		},
		"insecureSkipTLSVerify on a gRPC probe without TLS": {
			spec: withProbe("- mode: GRPC\n  grpc: {targetPort: 9090, tls: false, insecureSkipTLSVerify: true}"),
			want: "grpc.insecureSkipTLSVerify is only used with tls: true",
		},
		"a gRPC probe with both a CA certificate and insecureSkipTLSVerify": {
			spec: withProbe("- mode: GRPC\n  grpc: {targetPort: 9090, tls: true, insecureSkipTLSVerify: true, caCert: \"-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----\"}"),
			want: "set either grpc.caCert (verify against this CA) or grpc.insecureSkipTLSVerify, not both",
		},
		"a gRPC CA certificate that is not PEM": {
			spec: withProbe("- mode: GRPC\n  grpc: {targetPort: 9090, tls: true, caCert: not-a-certificate}"),
			want: "grpc.caCert must hold a PEM certificate",
		},
		"a gRPC CA certificate longer than the bound": {
			spec: withProbe(fmt.Sprintf("- mode: GRPC\n  grpc:\n    targetPort: 9090\n    tls: true\n    caCert: %q", pemOfLength(v1alpha1.MaxCACertLength+1))),
			want: "spec.healthcheck.probes[0].grpc.caCert: Too long: may not be more than 16384",
		},
		"a gRPC host with a path": {
			spec: withProbe("- mode: GRPC\n  grpc: {targetPort: 9090, host: example.org/x}"),
			want: "grpc.host must be a host name, optionally with :port",
		},
		"a probe target port of zero": {
			spec: withProbe("- mode: TCP\n  tcp: {targetPort: 0}"),
			want: "targetPort must be a port number from 1 to 65535 or a container port name",
		},
		"a probe target port above 65535": {
			spec: withProbe("- mode: TCP\n  tcp: {targetPort: 70000}"),
			want: "targetPort must be a port number from 1 to 65535",
		},
		"a probe target port name that is not a port name": {
			spec: withProbe("- mode: TCP\n  tcp: {targetPort: Bad_Name}"),
			want: "or a container port name (lowercase letters, digits and '-', at most 15 characters, with at least one letter)",
		},
		"an HTTP path without a leading slash": {
			spec: withProbe("- mode: HTTP\n  http: {targetPort: 8080, path: healthz}"),
			want: "http.path must start with /",
		},
		"an HTTP header name with a space": {
			spec: withProbe("- mode: HTTP\n  http:\n    targetPort: 8080\n    httpHeaders: [{name: 'X Bad', value: v}]"),
			want: "header name must be an HTTP token",
		},
		"an HTTP method other than GET or HEAD": {
			spec: withProbe("- mode: HTTP\n  http: {targetPort: 8080, method: POST}"),
			want: `Unsupported value: "POST": supported values: "GET", "HEAD"`,
		},
		"an unknown HTTP scheme": {
			spec: withProbe("- mode: HTTP\n  http: {targetPort: 8080, scheme: FTP}"),
			want: `Unsupported value: "FTP": supported values: "HTTP", "HTTPS"`,
		},
		"a CA certificate on a plain HTTP probe": {
			spec: withProbe("- mode: HTTP\n  http: {targetPort: 8080, caCert: \"-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----\"}"),
			want: "http.caCert is only used with scheme: HTTPS",
		},
		"a CA certificate that is not PEM": {
			spec: withProbe("- mode: HTTP\n  http: {targetPort: 8080, scheme: HTTPS, caCert: not-a-certificate}"),
			want: "http.caCert must hold a PEM certificate",
		},
		"a descending status code range": {
			spec: withProbe("- mode: HTTP\n  http: {targetPort: 8080, successStatusCodes: ['299-200']}"),
			want: "http.successStatusCodes entries must be a status code",
		},
		"a failure threshold of zero": {
			spec: withProbe("- mode: TCP\n  failureThreshold: 0\n  tcp: {targetPort: 8080}"),
			want: "spec.healthcheck.probes[0].failureThreshold in body should be greater than or equal to 1",
		},
		"a timeout longer than the period": {
			spec: validPorts + "healthcheck:\n  periodSeconds: 5\n  probes:\n  - mode: TCP\n    timeoutSeconds: 6\n    tcp: {targetPort: 8080}\n",
			want: "healthcheck.probes[].timeoutSeconds must not exceed healthcheck.periodSeconds",
		},
		"a period of zero": {
			spec: validPorts + "healthcheck:\n  periodSeconds: 0\n",
			want: "periodSeconds in body should be greater than or equal to 1",
		},
		"a Service port of zero": {
			spec: "ports:\n- {name: web, port: 0}\n",
			want: "port in body should be greater than or equal to 1",
		},
		"a Service port above 65535": {
			spec: "ports:\n- {name: web, port: 65536}\n",
			want: "port in body should be less than or equal to 65535",
		},
		"two ports without names": {
			spec: "ports:\n- {port: 80}\n- {port: 25}\n",
			want: "every port needs a name when the resource exposes more than one port",
		},
		"two ports with the same name": {
			spec: "ports:\n- {name: web, port: 80}\n- {name: web, port: 8080}\n",
			want: "port names must be unique",
		},
		"a port name with capitals": {
			spec: "ports:\n- {name: Web, port: 80}\n",
			want: "port name must consist of lowercase letters, digits and '-'",
		},
		"no ports on a resource that is not headless": {
			spec: "selector: {app: demo}\n",
			want: "spec.ports must list at least one port (only a headless resource, clusterIP: None, may have none)",
		},
		"type ExternalName": {
			spec: "type: ExternalName\nports:\n- {port: 80}\n",
			want: "type ExternalName is not supported: an ExternalName Service has no endpoints to check",
		},
		"an externalTrafficPolicy on a ClusterIP resource": {
			spec: "externalTrafficPolicy: Local\nports:\n- {port: 80}\n",
			want: "externalTrafficPolicy may only be set for type NodePort or LoadBalancer",
		},
		"a sessionAffinityConfig without ClientIP affinity": {
			spec: "sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}\nports:\n- {port: 80}\n",
			want: "sessionAffinityConfig may only be set with sessionAffinity: ClientIP",
		},
		"a CA certificate longer than the bound": {
			spec: withProbe(httpsProbe(fmt.Sprintf("caCert: %q", pemOfLength(v1alpha1.MaxCACertLength+1)))),
			want: "spec.healthcheck.probes[0].http.caCert: Too long: may not be more than 16384",
		},
		"more than 32 HTTP headers": {
			spec: withProbe(httpProbe("httpHeaders: " + headers(33, 1))),
			want: "spec.healthcheck.probes[0].http.httpHeaders: Too many: 33: must have at most 32 items",
		},
		"HTTP headers longer than 8192 characters together": {
			spec: withProbe(httpProbe("httpHeaders: " + headersOfTotalLength(3, v1alpha1.MaxHTTPHeadersLength+1))),
			want: "http.httpHeaders may hold at most 8192 characters of header names and values together",
		},
		"an HTTP header name longer than 256 characters": {
			spec: withProbe(httpProbe(fmt.Sprintf("httpHeaders: [{name: %s, value: v}]", strings.Repeat("X", 257)))),
			want: "spec.healthcheck.probes[0].http.httpHeaders[0].name: Too long: may not be more than 256",
		},
		"an HTTP header value longer than 4096 characters": {
			spec: withProbe(httpProbe(fmt.Sprintf("httpHeaders: [{name: X-A, value: %s}]", strings.Repeat("v", 4097)))),
			want: "spec.healthcheck.probes[0].http.httpHeaders[0].value: Too long: may not be more than 4096",
		},
		"a probe that needs more than an hour to fail": {
			spec: validPorts + "healthcheck:\n  periodSeconds: 1800\n  probes:\n  - mode: TCP\n    failureThreshold: 3\n    tcp: {targetPort: 8080}\n",
			want: "a probe must be able to change its verdict within an hour: healthcheck.periodSeconds × the larger of its successThreshold and failureThreshold must be at most 3600 seconds",
		},
		"a probe that needs more than an hour to pass": {
			spec: validPorts + "healthcheck:\n  periodSeconds: 60\n  probes:\n  - mode: TCP\n    successThreshold: 61\n    failureThreshold: 1\n    tcp: {targetPort: 8080}\n",
			want: "a probe must be able to change its verdict within an hour",
		},
		"an appProtocol with a space": {
			spec: "ports:\n- {port: 80, appProtocol: 'my protocol'}\n",
			want: "spec.ports[0].appProtocol: Invalid value: \"my protocol\": appProtocol must be a qualified name, as in a Service",
		},
		"an appProtocol with two slashes": {
			spec: "ports:\n- {port: 80, appProtocol: example.com/a/b}\n",
			want: "appProtocol must be a qualified name",
		},
		"an http.path with a broken escape": {
			spec: withProbe(httpProbe("path: /%zz")),
			want: "spec.healthcheck.probes[0].http.path: Invalid value: \"/%zz\": http.path must be a request path the probe can send: no control characters",
		},
		"an http.path with a newline": {
			spec: withProbe(httpProbe(`path: "/health\nX-Injected: 1"`)),
			want: "http.path must be a request path the probe can send",
		},
		"a credential Secret name with spaces": {
			spec: withProbe("- mode: PostgreSQL\n  postgreSQL: {targetPort: 5432, authSecretName: 'db creds'}"),
			want: "postgreSQL.authSecretName must be a Secret name",
		},
		"a name that is not a DNS-1035 label": {
			name: "web.v1",
			spec: "ports:\n- {port: 80}\n",
			want: "metadata.name must be a DNS-1035 label",
		},
		"a name that starts with a digit": {
			name: "1web",
			spec: "ports:\n- {port: 80}\n",
			want: "metadata.name must be a DNS-1035 label",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			objName := tc.name
			if objName == "" {
				objName = "invalid"
			}
			err := env.Client.Create(t.Context(), object(t, ns, objName, tc.spec))
			require.Error(t, err, "the API server must reject this resource")
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// designExample is the resource of DESIGN §2 with every optional value left out.
const designExample = `
ports:
- {name: web, port: 80, targetPort: 8080}
- {name: smtp, port: 25, targetPort: 2525}
- {name: postgres, port: 5432}
selector: {app: demo}
healthcheck:
  probes:
  - mode: HTTP
    http:
      targetPort: 8080
      path: /healthz
      host: example.org
      httpHeaders: [{name: X-Probe, value: swh}]
  - mode: TCP
    tcp: {targetPort: 2525}
  - mode: PostgreSQL
    postgreSQL:
      targetPort: 5432
      dbName: app
      query: SELECT NOT pg_is_in_recovery()
      authSecretName: db-creds
`

func TestTheDesignExampleIsAcceptedWithDefaults(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "crd-valid")
	require.NoError(t, env.Client.Create(t.Context(), object(t, ns, "db", designExample)))

	var got v1alpha1.ServiceWithHealthchecks
	require.NoError(t, env.Client.Get(t.Context(), keyOf(ns, "db"), &got))

	assert.Equal(t, "ClusterIP", string(got.Spec.Type))
	assert.Equal(t, "None", string(got.Spec.SessionAffinity))
	for _, p := range got.Spec.Ports {
		assert.Equal(t, "TCP", string(p.Protocol), "port %s", p.Name)
	}
	hc := got.Spec.Healthcheck
	require.NotNil(t, hc)
	assert.Equal(t, v1alpha1.DefaultInitialDelaySeconds, hc.InitialDelaySeconds)
	assert.Equal(t, v1alpha1.DefaultPeriodSeconds, hc.PeriodSeconds)
	require.Len(t, hc.Probes, 3)
	for _, p := range hc.Probes {
		assert.Equal(t, v1alpha1.DefaultTimeoutSeconds, p.TimeoutSeconds, "probe %s", p.Mode)
		assert.Equal(t, v1alpha1.DefaultSuccessThreshold, p.SuccessThreshold, "probe %s", p.Mode)
		assert.Equal(t, v1alpha1.DefaultFailureThreshold, p.FailureThreshold, "probe %s", p.Mode)
	}
	httpProbe := hc.Probes[0].HTTP
	require.NotNil(t, httpProbe)
	assert.Equal(t, "GET", httpProbe.Method)
	assert.Equal(t, "HTTP", string(httpProbe.Scheme))
	assert.Equal(t, "/healthz", httpProbe.Path)
	assert.Equal(t, "example.org", httpProbe.Host)
	assert.Equal(t, int32(8080), httpProbe.TargetPort.IntVal)
	pg := hc.Probes[2].PostgreSQL
	require.NotNil(t, pg)
	assert.Equal(t, "app", pg.DBName)
	assert.Equal(t, "SELECT NOT pg_is_in_recovery()", pg.Query)
	assert.Equal(t, "db-creds", pg.AuthSecretName)
}

func TestOptionalValuesGetTheirDefaults(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "crd-defaults")
	spec := validPorts + "healthcheck:\n  probes:\n  - mode: HTTP\n    http: {targetPort: web-port}\n  - mode: PostgreSQL\n    postgreSQL: {targetPort: 5432}\n  - mode: MySQL\n    mySQL: {targetPort: 3306}\n"
	require.NoError(t, env.Client.Create(t.Context(), object(t, ns, "defaults", spec)))

	var got v1alpha1.ServiceWithHealthchecks
	require.NoError(t, env.Client.Get(t.Context(), keyOf(ns, "defaults"), &got))
	require.Len(t, got.Spec.Healthcheck.Probes, 3)
	httpProbe := got.Spec.Healthcheck.Probes[0].HTTP
	assert.Equal(t, "/", httpProbe.Path)
	assert.Equal(t, "web-port", httpProbe.TargetPort.StrVal)
	pg := got.Spec.Healthcheck.Probes[1].PostgreSQL
	assert.Equal(t, v1alpha1.DefaultPostgreSQLQuery, pg.Query)
	assert.Equal(t, v1alpha1.DefaultPostgreSQLDBName, pg.DBName)
	my := got.Spec.Healthcheck.Probes[2].MySQL
	assert.Equal(t, v1alpha1.DefaultMySQLQuery, my.Query)
	assert.Empty(t, my.DBName, "no database unless one is named")
}

func TestValidShapesAreAccepted(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "crd-accept")
	tests := map[string]struct {
		spec string
	}{
		"no healthcheck at all (plain readiness)": {spec: "ports:\n- {port: 80}\nselector: {app: x}\n"},
		"a headless resource without ports":       {spec: "clusterIP: None\nselector: {app: x}\n"},
		"a single unnamed port":                   {spec: "ports:\n- {port: 80, targetPort: http}\n"},
		"a LoadBalancer with Local traffic policy": {
			spec: "type: LoadBalancer\nexternalTrafficPolicy: Local\nloadBalancerSourceRanges: [10.0.0.0/8]\nports:\n- {port: 80, nodePort: 30080}\n",
		},
		"HTTPS with a CA and custom status codes": {
			spec: withProbe("- mode: HTTP\n  http: {targetPort: 8443, scheme: HTTPS, caCert: \"-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----\", successStatusCodes: ['200-299', '418']}"),
		},
		"a targetPort of 0, which Go clients send for an unset value": {
			spec: "ports:\n- {port: 80, targetPort: 0}\n",
		},
		"a UDP and a TCP port on the same number": {
			spec: "ports:\n- {name: dns-udp, port: 53, protocol: UDP}\n- {name: dns-tcp, port: 53, protocol: TCP}\n",
		},
		"a CA certificate of exactly the bound": {
			spec: withProbe(httpsProbe(fmt.Sprintf("caCert: %q", pemOfLength(v1alpha1.MaxCACertLength)))),
		},
		"32 HTTP headers of exactly 8192 characters together": {
			spec: withProbe(httpProbe("httpHeaders: " + headersOfTotalLength(32, v1alpha1.MaxHTTPHeadersLength))),
		},
		"a probe that decides in exactly an hour": {
			spec: validPorts + "healthcheck:\n  periodSeconds: 36\n  probes:\n  - mode: TCP\n    timeoutSeconds: 5\n    successThreshold: 100\n    failureThreshold: 100\n    tcp: {targetPort: 8080}\n",
		},
		"a period of an hour with thresholds of one": {
			spec: validPorts + "healthcheck:\n  periodSeconds: 3600\n  probes:\n  - mode: TCP\n    successThreshold: 1\n    failureThreshold: 1\n    tcp: {targetPort: 8080}\n",
		},
		"an appProtocol with a domain prefix": {
			spec: "ports:\n- {port: 80, appProtocol: kubernetes.io/h2c}\n",
		},
		"an http.path with escapes, spaces and a query the probe sends as it is": {
			spec: withProbe(httpProbe("path: '/a%2Fb/héllo wörld?q=%zz&x'")),
		},
		"a plain gRPC probe of the whole server on a named port": {
			spec: withProbe("- mode: GRPC\n  grpc: {targetPort: grpc}"),
		},
		"a gRPC probe of a named service with an explicitly empty name elsewhere": {
			spec: withProbe("- mode: GRPC\n  grpc: {targetPort: 9090, service: my.package.Orders}\n- mode: GRPC\n  grpc: {targetPort: 9091, service: ''}"),
		},
		"gRPC over TLS with a CA and a host": {
			spec: withProbe("- mode: GRPC\n  grpc: {targetPort: 9443, tls: true, host: grpc.example.org, caCert: \"-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----\"}"),
		},
		"gRPC over TLS without verification": {
			spec: withProbe("- mode: GRPC\n  grpc: {targetPort: 9443, tls: true, insecureSkipTLSVerify: true}"),
		},
		"a gRPC service name of exactly 256 characters": {
			spec: withProbe(fmt.Sprintf("- mode: GRPC\n  grpc: {targetPort: 9090, service: %s}", strings.Repeat("s", 256))),
		},
	}
	i := 0
	for name, tc := range tests {
		i++
		objName := fmt.Sprintf("ok-%d", i)
		t.Run(name, func(t *testing.T) {
			require.NoError(t, env.Client.Create(t.Context(), object(t, ns, objName, tc.spec)))
		})
	}
}
