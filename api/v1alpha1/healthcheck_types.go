// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The healthcheck section of a ServiceWithHealthchecks: its probes, one section per mode.

// ProbeMode names the kind of check a probe performs.
// +kubebuilder:validation:Enum=HTTP;TCP;PostgreSQL;MySQL;GRPC
type ProbeMode string

// The probe modes.
const (
	ProbeModeHTTP       ProbeMode = "HTTP"
	ProbeModeTCP        ProbeMode = "TCP"
	ProbeModePostgreSQL ProbeMode = "PostgreSQL"
	ProbeModeMySQL      ProbeMode = "MySQL"
	ProbeModeGRPC       ProbeMode = "GRPC"
)

// Healthcheck holds the probes and their schedule.
//
// +kubebuilder:validation:XValidation:rule="!has(self.probes) || self.probes.all(p, self.periodSeconds * (p.successThreshold > p.failureThreshold ? p.successThreshold : p.failureThreshold) <= 3600)",message="a probe must be able to change its verdict within an hour: healthcheck.periodSeconds × the larger of its successThreshold and failureThreshold must be at most 3600 seconds; lower periodSeconds or the thresholds"
type Healthcheck struct {
	// InitialDelaySeconds after the pod starts before its first probe.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=3600
	InitialDelaySeconds int32 `json:"initialDelaySeconds"`

	// PeriodSeconds between two runs of a probe.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	PeriodSeconds int32 `json:"periodSeconds"`

	// Probes, grouped by the port they check: a probe whose targetPort is the target port of a
	// Service port checks that port; any other targetPort checks the pod as a whole.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Probes []Probe `json:"probes,omitempty"`
}

// Probe is one active check of a pod.
//
// +kubebuilder:validation:XValidation:rule="self.mode != 'TCP' || (has(self.tcp) && !has(self.http) && !has(self.postgreSQL) && !has(self.mySQL) && !has(self.grpc))",message="a probe with mode: TCP must set tcp: {targetPort: ...} and none of http, postgreSQL, mySQL, grpc"
// +kubebuilder:validation:XValidation:rule="self.mode != 'HTTP' || (has(self.http) && !has(self.tcp) && !has(self.postgreSQL) && !has(self.mySQL) && !has(self.grpc))",message="a probe with mode: HTTP must set http: {targetPort: ...} and none of tcp, postgreSQL, mySQL, grpc"
// +kubebuilder:validation:XValidation:rule="self.mode != 'PostgreSQL' || (has(self.postgreSQL) && !has(self.tcp) && !has(self.http) && !has(self.mySQL) && !has(self.grpc))",message="a probe with mode: PostgreSQL must set postgreSQL: {targetPort: ...} and none of tcp, http, mySQL, grpc"
// +kubebuilder:validation:XValidation:rule="self.mode != 'MySQL' || (has(self.mySQL) && !has(self.tcp) && !has(self.http) && !has(self.postgreSQL) && !has(self.grpc))",message="a probe with mode: MySQL must set mySQL: {targetPort: ...} and none of tcp, http, postgreSQL, grpc"
// +kubebuilder:validation:XValidation:rule="self.mode != 'GRPC' || (has(self.grpc) && !has(self.tcp) && !has(self.http) && !has(self.postgreSQL) && !has(self.mySQL))",message="a probe with mode: GRPC must set grpc: {targetPort: ...} and none of tcp, http, postgreSQL, mySQL"
type Probe struct {
	// Mode of the probe: HTTP, TCP, PostgreSQL, MySQL or GRPC. The block of the same name holds its settings.
	// +required
	Mode ProbeMode `json:"mode"`

	// TimeoutSeconds is the hard deadline of one run.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=300
	TimeoutSeconds int32 `json:"timeoutSeconds"`

	// SuccessThreshold is how many consecutive passes make a failing target pass.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	SuccessThreshold int32 `json:"successThreshold"`

	// FailureThreshold is how many consecutive failures make a passing target fail.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	FailureThreshold int32 `json:"failureThreshold"`

	// TCP opens a connection and closes it at once, sending nothing; with steps it first holds
	// a short dialogue (send, expect) with the server.
	// +optional
	TCP *TCPProbe `json:"tcp,omitempty"`

	// HTTP sends one request and checks the status code.
	// +optional
	HTTP *HTTPProbe `json:"http,omitempty"`

	// PostgreSQL runs a read-only query; see the query field for what passes.
	// +optional
	PostgreSQL *PostgreSQLProbe `json:"postgreSQL,omitempty"`

	// MySQL runs a read-only query against MySQL or MariaDB; see the query field for what passes.
	// +optional
	MySQL *MySQLProbe `json:"mySQL,omitempty"`

	// GRPC asks the gRPC health service (grpc.health.v1.Health/Check) and passes on SERVING.
	// +optional
	GRPC *GRPCProbe `json:"grpc,omitempty"`
}

// TCPProbe connects to a port of the pod.
type TCPProbe struct {
	// TargetPort on the pod: a number, or the name of a container port.
	// +required
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? (self >= 1 && self <= 65535) : (size(self) <= 15 && self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && self.matches('[a-z]') && !self.contains('--'))",message="targetPort must be a port number from 1 to 65535 or a container port name (lowercase letters, digits and '-', at most 15 characters, with at least one letter)"
	TargetPort intstr.IntOrString `json:"targetPort"`

	// Steps, in order, after the connection is open: send writes bytes, expect reads the reply
	// and checks it (HAProxy's tcp-check send/expect). At most 8 steps. Without steps the probe
	// sends nothing. The probe passes when every step passed within timeoutSeconds. (The
	// schema's maxItems is twice the bound: it caps the rules' cost, while the bound itself is a
	// rule, so that 9 to 16 steps get its message rather than a bare "Too many".)
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="size(self) <= 8",message="tcp.steps may hold at most 8 steps (sends and expects together): a health check is a short dialogue, such as a banner, or a command and its reply"
	Steps []TCPStep `json:"steps,omitempty"`
}

// TCPStep is one step of a TCP dialogue: exactly one of send and expect.
//
// +kubebuilder:validation:XValidation:rule="has(self.send) != has(self.expect)",message="each tcp.steps entry must set exactly one of send (bytes the probe writes) and expect (what the server must answer); write a command and the check of its reply as two steps"
type TCPStep struct {
	// Send writes these bytes. Escapes: \r, \n, \t, \\ (a backslash) and \xHH (one byte in
	// two hex digits); every other character is sent as its UTF-8 bytes. At most 1024 bytes as
	// written (escapes count as written, \x00 as four), so a step never sends more.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self.matches(r'^([^\\\\]|\\\\[rnt\\\\]|\\\\x[0-9A-Fa-f]{2})*$')",message="tcp.steps[].send: a backslash must start an escape: \\r, \\n, \\t, \\\\ (a backslash) or \\xHH (one byte in two hex digits, e.g. \\x00)"
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 1024",message="tcp.steps[].send may hold at most 1024 bytes as written (UTF-8; an escape counts as written, \\x00 as four): a health check sends a short command"
	Send string `json:"send,omitempty"`

	// Expect reads the server's reply and checks it.
	// +optional
	Expect *TCPExpect `json:"expect,omitempty"`
}

// TCPExpect checks the reply the server sends after the previous step: exactly one of prefix and
// regex. It reads at most 4096 bytes (MaxTCPExpectBytes) and fails at that bound, at the
// deadline or when the server closes the connection without a match. Once it passes, what was
// read is dropped: the next expect checks what arrives after.
//
// +kubebuilder:validation:XValidation:rule="has(self.prefix) != has(self.regex)",message="tcp.steps[].expect must set exactly one of prefix (the reply starts with these bytes) and regex (an RE2 regular expression the reply matches)"
type TCPExpect struct {
	// Prefix the reply must start with, with the escapes of send ("+PONG", "220", "\x00").
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self.matches(r'^([^\\\\]|\\\\[rnt\\\\]|\\\\x[0-9A-Fa-f]{2})*$')",message="tcp.steps[].expect.prefix: a backslash must start an escape: \\r, \\n, \\t, \\\\ (a backslash) or \\xHH (one byte in two hex digits, e.g. \\x00)"
	Prefix string `json:"prefix,omitempty"`

	// Regex, in RE2 syntax (Go's regexp: no backreferences or lookaround), must match somewhere
	// in the reply read so far ("role:master"); "^" anchors at the start of the reply, "(?m)^"
	// at the start of any line.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="type(''.matches(self)) == bool",message="tcp.steps[].expect.regex must be an RE2 regular expression (Go's regexp syntax: no backreferences or lookaround)"
	Regex string `json:"regex,omitempty"`
}

// HTTPHeader is a header sent with an HTTP probe.
type HTTPHeader struct {
	// Name of the header (an HTTP token).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-!#$%&\\'*+.^_`|~0-9A-Za-z]+$')",message="header name must be an HTTP token: letters, digits and !#$%&'*+-.^_`|~, no spaces or colons"
	Name string `json:"name"`

	// Value of the header.
	// +required
	// +kubebuilder:validation:MaxLength=4096
	Value string `json:"value"`
}

// HTTPProbe sends an HTTP request to the pod.
//
// +kubebuilder:validation:XValidation:rule="!has(self.caCert) || self.scheme == 'HTTPS'",message="http.caCert is only used with scheme: HTTPS"
// +kubebuilder:validation:XValidation:rule="!has(self.insecureSkipTLSVerify) || !self.insecureSkipTLSVerify || self.scheme == 'HTTPS'",message="http.insecureSkipTLSVerify is only used with scheme: HTTPS"
// +kubebuilder:validation:XValidation:rule="!has(self.caCert) || !has(self.insecureSkipTLSVerify) || !self.insecureSkipTLSVerify",message="set either http.caCert (verify against this CA) or http.insecureSkipTLSVerify, not both"
type HTTPProbe struct {
	// TargetPort on the pod: a number, or the name of a container port.
	// +required
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? (self >= 1 && self <= 65535) : (size(self) <= 15 && self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && self.matches('[a-z]') && !self.contains('--'))",message="targetPort must be a port number from 1 to 65535 or a container port name (lowercase letters, digits and '-', at most 15 characters, with at least one letter)"
	TargetPort intstr.IntOrString `json:"targetPort"`

	// Path of the request, with an optional ?query: it must start with "/", hold no control
	// characters, and every "%" before the query must start an escape of two hex digits (the
	// probe cannot send the request otherwise).
	// +optional
	// +kubebuilder:default="/"
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/')",message="http.path must start with /"
	// +kubebuilder:validation:XValidation:rule="self.matches('^([^%?[:cntrl:]]|%[0-9A-Fa-f]{2})*([?][^[:cntrl:]]*)?$')",message="http.path must be a request path the probe can send: no control characters (tab, newline, ...), and every '%' before the ?query must start an escape of two hex digits such as %2F (write a literal % as %25)"
	Path string `json:"path,omitempty"`

	// Host sets the Host header and the TLS server name. It never changes where the probe
	// connects: probes only ever dial the pod's own IP.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?$')",message="http.host must be a host name, optionally with :port"
	Host string `json:"host,omitempty"`

	// Method: GET (default) or HEAD.
	// +optional
	// +kubebuilder:default=GET
	// +kubebuilder:validation:Enum=GET;HEAD
	Method string `json:"method,omitempty"`

	// Scheme: HTTP (default) or HTTPS.
	// +optional
	// +kubebuilder:default=HTTP
	// +kubebuilder:validation:Enum=HTTP;HTTPS
	Scheme corev1.URIScheme `json:"scheme,omitempty"`

	// HTTPHeaders sent with the request: at most 32, their names and values together at most
	// 8192 characters.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self.map(h, size(h.name) + size(h.value)).sum() <= 8192",message="http.httpHeaders may hold at most 8192 characters of header names and values together: servers commonly refuse larger request headers"
	HTTPHeaders []HTTPHeader `json:"httpHeaders,omitempty"`

	// CACert (PEM) the server certificate must chain to, for scheme HTTPS: at most 16384
	// characters, about ten certificates. Without it the system roots are used.
	// +optional
	// +kubebuilder:validation:MaxLength=16384
	// +kubebuilder:validation:XValidation:rule="self.contains('-----BEGIN CERTIFICATE-----')",message="http.caCert must hold a PEM certificate (-----BEGIN CERTIFICATE----- ...)"
	CACert string `json:"caCert,omitempty"`

	// InsecureSkipTLSVerify accepts any server certificate, for scheme HTTPS.
	// +optional
	InsecureSkipTLSVerify bool `json:"insecureSkipTLSVerify,omitempty"`

	// SuccessStatusCodes extends the passing status codes (200-399 by default, like the kubelet)
	// with codes ("418") and ranges ("400-404"). When set, only the listed codes pass.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=7
	// +kubebuilder:validation:items:XValidation:rule="self.matches('^[1-5][0-9][0-9](-[1-5][0-9][0-9])?$') && (size(self) == 3 || self.substring(0, 3) <= self.substring(4, 7))",message="http.successStatusCodes entries must be a status code (\"200\") or an ascending range (\"200-299\") between 100 and 599"
	SuccessStatusCodes []string `json:"successStatusCodes,omitempty"`
}

// PostgreSQLProbe runs a query against a PostgreSQL server in the pod.
type PostgreSQLProbe struct {
	// TargetPort on the pod: a number, or the name of a container port.
	// +required
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? (self >= 1 && self <= 65535) : (size(self) <= 15 && self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && self.matches('[a-z]') && !self.contains('--'))",message="targetPort must be a port number from 1 to 65535 or a container port name (lowercase letters, digits and '-', at most 15 characters, with at least one letter)"
	TargetPort intstr.IntOrString `json:"targetPort"`

	// DBName is the database to connect to.
	// +optional
	// +kubebuilder:default=postgres
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	DBName string `json:"dbName,omitempty"`

	// Query runs read-only with a server-side statement timeout. An error, no row, or a
	// false-like first value (f, false, 0, no, off, NULL) fails; any other result passes.
	// "SELECT 1" checks that the server answers; "SELECT NOT pg_is_in_recovery()" that it is
	// the primary.
	// +optional
	// +kubebuilder:default="SELECT 1"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	Query string `json:"query,omitempty"`

	// AuthSecretName names a Secret of type network.deckhouse.io/postgresql-credentials in the
	// resource's namespace (keys user, password, tlsMode, caCert, clientCert, clientKey).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="postgreSQL.authSecretName must be a Secret name (lowercase letters, digits, '-' and '.')"
	AuthSecretName string `json:"authSecretName,omitempty"`
}

// MySQLProbe runs a query against a MySQL or MariaDB server in the pod.
type MySQLProbe struct {
	// TargetPort on the pod: a number, or the name of a container port.
	// +required
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? (self >= 1 && self <= 65535) : (size(self) <= 15 && self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && self.matches('[a-z]') && !self.contains('--'))",message="targetPort must be a port number from 1 to 65535 or a container port name (lowercase letters, digits and '-', at most 15 characters, with at least one letter)"
	TargetPort intstr.IntOrString `json:"targetPort"`

	// DBName is the database to select after connecting; empty selects none.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	DBName string `json:"dbName,omitempty"`

	// Query runs in a read-only transaction, alone (no multi-statements). It passes when the
	// first column of the first row is true: a non-zero number (TRUE is 1 in MySQL) or the text
	// "true" (any case). An error, no row, NULL, zero, or any other value fails.
	// "SELECT 1" checks that the server answers; "SELECT @@read_only = 0" that it accepts writes.
	// +optional
	// +kubebuilder:default="SELECT 1"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	Query string `json:"query,omitempty"`

	// AuthSecretName names a Secret of type network.deckhouse.io/mysql-credentials in the
	// resource's namespace (keys user, password, tlsMode, caCert, clientCert, clientKey).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="mySQL.authSecretName must be a Secret name (lowercase letters, digits, '-' and '.')"
	AuthSecretName string `json:"authSecretName,omitempty"`
}

// GRPCProbe asks a gRPC server in the pod for its health (grpc.health.v1.Health/Check), like
// the kubelet's gRPC probe; TLS is set up as for an HTTPS probe.
//
// +kubebuilder:validation:XValidation:rule="!has(self.caCert) || (has(self.tls) && self.tls)",message="grpc.caCert is only used with tls: true"
// +kubebuilder:validation:XValidation:rule="!has(self.insecureSkipTLSVerify) || !self.insecureSkipTLSVerify || (has(self.tls) && self.tls)",message="grpc.insecureSkipTLSVerify is only used with tls: true"
// +kubebuilder:validation:XValidation:rule="!has(self.caCert) || !has(self.insecureSkipTLSVerify) || !self.insecureSkipTLSVerify",message="set either grpc.caCert (verify against this CA) or grpc.insecureSkipTLSVerify, not both"
type GRPCProbe struct {
	// TargetPort on the pod: a number, or the name of a container port.
	// +required
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? (self >= 1 && self <= 65535) : (size(self) <= 15 && self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && self.matches('[a-z]') && !self.contains('--'))",message="targetPort must be a port number from 1 to 65535 or a container port name (lowercase letters, digits and '-', at most 15 characters, with at least one letter)"
	TargetPort intstr.IntOrString `json:"targetPort"`

	// Service is the name the health service is asked about (HealthCheckRequest.service),
	// such as "grpc.health.v1.Health" or "my.package.Orders". Empty asks about the server as a
	// whole.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self.matches('^([A-Za-z0-9_][-A-Za-z0-9_./]*)?$')",message="grpc.service must be a gRPC service name such as my.package.Orders (letters, digits, '_', '-', '.' and '/', not starting with '-', '.' or '/', no spaces), or empty for the whole server"
	Service string `json:"service,omitempty"`

	// TLS speaks TLS to the server (the gRPC server's own TLS, not a mesh's).
	// +optional
	TLS bool `json:"tls,omitempty"`

	// Host sets the :authority of the request and the TLS server name. It never changes where
	// the probe connects: probes only ever dial the pod's own IP.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?$')",message="grpc.host must be a host name, optionally with :port"
	Host string `json:"host,omitempty"`

	// CACert (PEM) the server certificate must chain to, with tls: true: at most 16384
	// characters, about ten certificates. Without it the system roots are used.
	// +optional
	// +kubebuilder:validation:MaxLength=16384
	// +kubebuilder:validation:XValidation:rule="self.contains('-----BEGIN CERTIFICATE-----')",message="grpc.caCert must hold a PEM certificate (-----BEGIN CERTIFICATE----- ...)"
	CACert string `json:"caCert,omitempty"`

	// InsecureSkipTLSVerify accepts any server certificate, with tls: true.
	// +optional
	InsecureSkipTLSVerify bool `json:"insecureSkipTLSVerify,omitempty"`
}
