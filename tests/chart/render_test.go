// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// baseCounts are the objects every value set renders, without the optional platform objects.
func baseCounts() map[string]int {
	return map[string]int{
		"Namespace":                        1,
		"Secret":                           1,
		"ServiceAccount":                   2,
		"ClusterRole":                      3,
		"ClusterRoleBinding":               3,
		"Role":                             3,
		"RoleBinding":                      3,
		"Deployment":                       1,
		"DaemonSet":                        1,
		"PodDisruptionBudget":              1,
		"ValidatingAdmissionPolicy":        8,
		"ValidatingAdmissionPolicyBinding": 8,
	}
}

func with(counts map[string]int, add map[string]int) map[string]int {
	for k, v := range add {
		counts[k] += v
		if counts[k] == 0 {
			delete(counts, k)
		}
	}
	return counts
}

// platformObjects: PrometheusRule is one per monitoring/prometheus-rules/*.yaml (monitoring_test.go
// checks them one by one).
var platformObjects = map[string]int{"VerticalPodAutoscaler": 2, "PodMonitor": 2, "PrometheusRule": 3}

type valueSetCase struct {
	wantCounts       map[string]int
	wantReplicas     int32
	wantNodeSelector map[string]string
	wantTolerations  []corev1.Toleration
	wantLogLevel     string
	wantAgentFlags   map[string]string
	wantLostGrace    string
	wantCtrlAPI      map[string]string // the controller's --kube-api-qps and --kube-api-burst
	wantCredentials  map[string][]string
}

var systemTolerations = []corev1.Toleration{
	{Key: "dedicated.deckhouse.io", Operator: corev1.TolerationOpEqual, Value: "system"},
	{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "system"},
}

var defaultAgentFlags = map[string]string{"probe-concurrency": "64", "max-probe-targets": "20000", "kube-api-qps": "20", "kube-api-burst": "40", "lease-renew-interval": "10s"}

// defaultCtrlAPI are the controller's own defaults (images/controller/internal/config).
var defaultCtrlAPI = map[string]string{"kube-api-qps": "50", "kube-api-burst": "100"}

// ValueSets are the configurations the chart is rendered with, here and in the cluster tests.
func valueSets() map[string]valueSetCase {
	return map[string]valueSetCase{
		bundle.SetDefaults: {
			wantCounts:      with(baseCounts(), platformObjects),
			wantReplicas:    2,
			wantTolerations: systemTolerations,
			wantLogLevel:    "info",
			wantAgentFlags:  defaultAgentFlags,
			wantLostGrace:   "40s",
			wantCtrlAPI:     defaultCtrlAPI,
		},
		bundle.SetSingle: {
			wantCounts:      with(baseCounts(), platformObjects),
			wantReplicas:    1,
			wantTolerations: systemTolerations,
			wantLogLevel:    "info",
			wantAgentFlags:  defaultAgentFlags,
			wantLostGrace:   "40s",
			wantCtrlAPI:     defaultCtrlAPI,
		},
		bundle.SetCredentials: {
			wantCounts:      with(baseCounts(), with(map[string]int{"Role": 2, "RoleBinding": 2}, platformObjects)),
			wantReplicas:    2,
			wantTolerations: systemTolerations,
			wantLogLevel:    "info",
			wantAgentFlags:  defaultAgentFlags,
			wantLostGrace:   "40s",
			wantCtrlAPI:     defaultCtrlAPI,
			wantCredentials: map[string][]string{bundle.CredentialsNSA: {"pg-main", "pg-replica"}, bundle.CredentialsNSB: {"orders-db"}},
		},
		bundle.SetPlacement: {
			wantCounts:       with(baseCounts(), platformObjects),
			wantReplicas:     2,
			wantNodeSelector: map[string]string{"node-role.example.com/infra": ""},
			wantTolerations: []corev1.Toleration{{
				Key: "dedicated.example.com", Operator: corev1.TolerationOpEqual, Value: "infra", Effect: corev1.TaintEffectNoExecute,
			}},
			wantLogLevel:   "info",
			wantAgentFlags: defaultAgentFlags,
			wantLostGrace:  "40s",
			wantCtrlAPI:    defaultCtrlAPI,
		},
		bundle.SetSystemNodes: {
			wantCounts:       with(baseCounts(), platformObjects),
			wantReplicas:     2,
			wantNodeSelector: map[string]string{"node-role.deckhouse.io/system": ""},
			wantTolerations:  systemTolerations,
			wantLogLevel:     "info",
			wantAgentFlags:   defaultAgentFlags,
			wantLostGrace:    "40s",
			wantCtrlAPI:      defaultCtrlAPI,
		},
		bundle.SetDebug: {
			wantCounts:      with(baseCounts(), platformObjects),
			wantReplicas:    2,
			wantTolerations: systemTolerations,
			wantLogLevel:    "debug",
			wantAgentFlags:  map[string]string{"probe-concurrency": "200", "max-probe-targets": "20000", "kube-api-qps": "50", "kube-api-burst": "100", "lease-renew-interval": "10s"},
			wantLostGrace:   "1m30s",
			wantCtrlAPI:     map[string]string{"kube-api-qps": "200", "kube-api-burst": "400"},
		},
		// The grace of 8s reaches the controller, and the interval the settings hook derives from
		// it (a quarter, hooks/settings) the agents.
		bundle.SetTenantRules: {
			wantCounts:      with(baseCounts(), platformObjects),
			wantReplicas:    2,
			wantTolerations: systemTolerations,
			wantLogLevel:    "info",
			wantAgentFlags:  withFlags(defaultAgentFlags, map[string]string{"lease-renew-interval": "2s"}),
			wantLostGrace:   "8s",
			wantCtrlAPI:     defaultCtrlAPI,
		},
		bundle.SetNoPlatform: {
			wantCounts:      baseCounts(),
			wantReplicas:    2,
			wantTolerations: systemTolerations,
			wantLogLevel:    "info",
			wantAgentFlags:  defaultAgentFlags,
			wantLostGrace:   "40s",
			wantCtrlAPI:     defaultCtrlAPI,
		},
		// The deliveries change images and pull credentials only (images_test.go).
		// with the module's registry Secret beside the platform's
		bundle.SetExternal: defaultsCase(with(baseCounts(), with(map[string]int{"Secret": 1}, platformObjects))),
		bundle.SetPackage:  defaultsCase(with(baseCounts(), platformObjects)),
		// no registry Secret at all
		bundle.SetNoDockercfg: defaultsCase(with(baseCounts(), with(map[string]int{"Secret": -1}, platformObjects))),
	}
}

// withFlags is base with the entries of over, in a new map.
func withFlags(base, over map[string]string) map[string]string {
	out := maps.Clone(base)
	maps.Copy(out, over)
	return out
}

// defaultsCase is what the default settings render, with these counts.
func defaultsCase(counts map[string]int) valueSetCase {
	return valueSetCase{
		wantCounts:      counts,
		wantReplicas:    2,
		wantTolerations: systemTolerations,
		wantLogLevel:    "info",
		wantAgentFlags:  defaultAgentFlags,
		wantLostGrace:   "40s",
		wantCtrlAPI:     defaultCtrlAPI,
	}
}

func render(t *testing.T, set bundle.ValueSet) bundle.Objects {
	t.Helper()
	objs, err := set.Render()
	require.NoError(t, err)
	return objs
}

func TestChartRendersEveryValueSet(t *testing.T) {
	sets := bundle.ValueSets()
	cases := valueSets()
	require.Len(t, cases, len(sets), "every value set has expectations")
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			set, ok := sets[name]
			require.True(t, ok, "value set %q", name)
			objs := render(t, set)
			require.Equal(t, tc.wantCounts, objs.Counts(), "kinds and counts")

			ctrl, err := objs.Deployment(bundle.Namespace, "controller")
			require.NoError(t, err)
			agent, err := objs.DaemonSet(bundle.Namespace, "agent")
			require.NoError(t, err)

			assertController(t, tc, set, ctrl)
			assertAgent(t, tc, set, agent)
			assertCredentialRoles(t, objs, tc.wantCredentials)
			assertNoSecretAccessOutsideCredentialRoles(t, objs)
		})
	}
}

func assertController(t *testing.T, tc valueSetCase, set bundle.ValueSet, d *appsv1.Deployment) {
	t.Helper()
	spec := &d.Spec.Template.Spec
	require.NotNil(t, d.Spec.Replicas)
	assert.Equal(t, tc.wantReplicas, *d.Spec.Replicas)
	assert.Equal(t, "controller", spec.ServiceAccountName)
	assert.Equal(t, "system-cluster-critical", spec.PriorityClassName)
	assert.Equal(t, tc.wantNodeSelector, nilIfEmpty(spec.NodeSelector))
	assert.Equal(t, tc.wantTolerations, spec.Tolerations)
	if tc.wantReplicas > 1 {
		require.NotNil(t, spec.Affinity, "replicas must keep to different nodes")
		terms := spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution
		require.Len(t, terms, 1)
		assert.Equal(t, "kubernetes.io/hostname", terms[0].TopologyKey)
		assert.Equal(t, map[string]string{"app": "controller"}, terms[0].LabelSelector.MatchLabels)
	} else {
		assert.Nil(t, spec.Affinity, "a single replica needs no anti-affinity")
	}
	assertPodSecurity(t, spec)

	c := bundle.Container(spec, "controller")
	require.NotNil(t, c)
	assert.Equal(t, set.ModuleImage("controller"), c.Image)
	for flag, want := range map[string]string{
		"leader-elect":              "true",
		"leader-election-namespace": bundle.Namespace,
		"agent-lease-namespace":     bundle.Namespace,
		"agent-lost-grace":          tc.wantLostGrace,
		"log-level":                 tc.wantLogLevel,
		"metrics-bind-address":      "127.0.0.1:8080",
		"kube-api-qps":              tc.wantCtrlAPI["kube-api-qps"],
		"kube-api-burst":            tc.wantCtrlAPI["kube-api-burst"],
	} {
		got, ok := bundle.Flag(c, flag)
		assert.True(t, ok, "flag --%s", flag)
		assert.Equal(t, want, got, "flag --%s", flag)
	}
	health, ok := bundle.Flag(c, "health-probe-bind-address")
	require.True(t, ok)
	_, healthPort, err := net.SplitHostPort(health)
	require.NoError(t, err)
	for name, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		require.NotNil(t, probe, name)
		require.NotNil(t, probe.HTTPGet, name)
		assert.Equal(t, healthPort, portNumber(t, c, probe.HTTPGet.Port.String()), "%s probe port is the health address", name)
	}

	assertMemoryLimitEnv(t, c)
	assertSidecar(t, spec, c, "8443", "deployments", "controller")
}

// assertMemoryLimitEnv checks that a program's container passes its own memory limit as
// MEMORY_LIMIT, which must exist: without one the downward API would give the node's allocatable
// memory. The program sets GOMEMLIMIT to 85 % of it (lib/memlimit), so GOMEMLIMIT itself is not
// set.
func assertMemoryLimitEnv(t *testing.T, c *corev1.Container) {
	t.Helper()
	assert.Nil(t, bundle.Env(c, "GOMEMLIMIT"), "%s: GOMEMLIMIT is not the whole limit: the program derives it", c.Name)
	memLimit := bundle.Env(c, "MEMORY_LIMIT")
	require.NotNil(t, memLimit, "%s: MEMORY_LIMIT is set", c.Name)
	require.NotNil(t, memLimit.ValueFrom)
	require.NotNil(t, memLimit.ValueFrom.ResourceFieldRef, "%s: MEMORY_LIMIT comes from the downward API", c.Name)
	assert.Equal(t, "limits.memory", memLimit.ValueFrom.ResourceFieldRef.Resource)
	assert.Contains(t, []string{"", c.Name}, memLimit.ValueFrom.ResourceFieldRef.ContainerName, "%s: its own limit", c.Name)
	assert.True(t, memLimit.ValueFrom.ResourceFieldRef.Divisor.IsZero() || memLimit.ValueFrom.ResourceFieldRef.Divisor.Value() == 1,
		"%s: in bytes, the unit the program reads", c.Name)
	_, hasLimit := c.Resources.Limits[corev1.ResourceMemory]
	assert.True(t, hasLimit, "%s has a memory limit for GOMEMLIMIT to follow", c.Name)
}

func assertAgent(t *testing.T, tc valueSetCase, set bundle.ValueSet, d *appsv1.DaemonSet) {
	t.Helper()
	spec := &d.Spec.Template.Spec
	assert.True(t, spec.HostNetwork, "the agent probes from the node's network namespace")
	assert.Equal(t, corev1.DNSClusterFirstWithHostNet, spec.DNSPolicy)
	assert.Equal(t, "agent", spec.ServiceAccountName)
	assert.Equal(t, "system-node-critical", spec.PriorityClassName)
	assert.Equal(t, []corev1.Toleration{{Operator: corev1.TolerationOpExists}}, spec.Tolerations, "the agent tolerates every taint")
	assert.Empty(t, spec.NodeSelector, "the agent runs on every node")
	for _, p := range append(bundle.Container(spec, "kube-rbac-proxy").Ports, bundle.Container(spec, "agent").Ports...) {
		assert.True(t, p.ContainerPort >= 4200 && p.ContainerPort <= 4299,
			"host-network port %s %d is in 4200-4299, the range Deckhouse keeps for host-network components", p.Name, p.ContainerPort)
	}
	require.NotNil(t, d.Spec.UpdateStrategy.RollingUpdate)
	assert.Equal(t, "0", d.Spec.UpdateStrategy.RollingUpdate.MaxSurge.String(), "host-network pods cannot surge")
	assert.Equal(t, "1", d.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.String())
	assertPodSecurity(t, spec)

	c := bundle.Container(spec, "agent")
	require.NotNil(t, c)
	assert.Equal(t, set.ModuleImage("agent"), c.Image)
	nodeName := bundle.Env(c, "NODE_NAME")
	require.NotNil(t, nodeName)
	require.NotNil(t, nodeName.ValueFrom)
	require.NotNil(t, nodeName.ValueFrom.FieldRef)
	assert.Equal(t, "spec.nodeName", nodeName.ValueFrom.FieldRef.FieldPath)
	assertMemoryLimitEnv(t, c)
	want := map[string]string{
		"node-name":       "$(NODE_NAME)",
		"lease-namespace": bundle.Namespace,
		"log-level":       tc.wantLogLevel,
	}
	for k, v := range tc.wantAgentFlags {
		want[k] = v
	}
	for flag, w := range want {
		got, ok := bundle.Flag(c, flag)
		assert.True(t, ok, "flag --%s", flag)
		assert.Equal(t, w, got, "flag --%s", flag)
	}
	metrics, ok := bundle.Flag(c, "metrics-bind-address")
	require.True(t, ok)
	assert.True(t, strings.HasPrefix(metrics, "127.0.0.1:"), "metrics stay on the node's loopback: %s", metrics)

	health, ok := bundle.Flag(c, "health-probe-bind-address")
	require.True(t, ok)
	healthHost, healthPort, err := net.SplitHostPort(health)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", healthHost, "health stays on the node's loopback")
	for _, addr := range []string{metrics, health} {
		_, port, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		n, err := strconv.Atoi(port)
		require.NoError(t, err)
		assert.True(t, n >= 4200 && n <= 4299, "the agent's host-network address %s is in 4200-4299", addr)
	}
	for name, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		require.NotNil(t, probe, name)
		require.NotNil(t, probe.HTTPGet, name)
		assert.Equal(t, "127.0.0.1", probe.HTTPGet.Host, "%s probe goes to the node's loopback", name)
		assert.Equal(t, healthPort, probe.HTTPGet.Port.String(), "%s probe port is the health address", name)
	}

	assertSidecar(t, spec, c, "4283", "daemonsets", "agent")
}

// assertSidecar checks the kube-rbac-proxy sidecar: it serves exactly the program's metrics
// address, on the pod's address and the agreed port, authorising by the agreed attributes.
func assertSidecar(t *testing.T, spec *corev1.PodSpec, program *corev1.Container, port, resource, name string) {
	t.Helper()
	proxy := bundle.Container(spec, "kube-rbac-proxy")
	require.NotNil(t, proxy, "kube-rbac-proxy sidecar")
	assert.Equal(t, bundle.CommonImage(), proxy.Image)
	listen, ok := bundle.Flag(proxy, "secure-listen-address")
	require.True(t, ok)
	assert.Equal(t, "$(KUBE_RBAC_PROXY_LISTEN_ADDRESS):"+port, listen)
	addr := bundle.Env(proxy, "KUBE_RBAC_PROXY_LISTEN_ADDRESS")
	require.NotNil(t, addr)
	require.NotNil(t, addr.ValueFrom)
	assert.Equal(t, "status.podIP", addr.ValueFrom.FieldRef.FieldPath)
	require.Len(t, proxy.Ports, 1)
	assert.Equal(t, "https-metrics", proxy.Ports[0].Name)
	assert.Equal(t, port, intString(proxy.Ports[0].ContainerPort))

	cfg, err := bundle.RBACProxyConfig(proxy)
	require.NoError(t, err)
	require.Len(t, cfg.Upstreams, 1)
	upstream, err := bundle.HostPort(cfg.Upstreams[0].Upstream)
	require.NoError(t, err)
	metrics, ok := bundle.Flag(program, "metrics-bind-address")
	require.True(t, ok)
	assert.Equal(t, metrics, upstream, "the sidecar's upstream is the program's metrics address")
	attrs := cfg.Upstreams[0].Authorization.ResourceAttributes
	assert.Equal(t, bundle.Namespace, attrs.Namespace)
	assert.Equal(t, "apps", attrs.APIGroup)
	assert.Equal(t, resource, attrs.Resource)
	assert.Equal(t, "prometheus-metrics", attrs.Subresource)
	assert.Equal(t, name, attrs.Name)
	for probeName, probe := range map[string]*corev1.Probe{"liveness": proxy.LivenessProbe, "readiness": proxy.ReadinessProbe} {
		require.NotNil(t, probe, probeName)
		assert.Equal(t, corev1.URISchemeHTTPS, probe.HTTPGet.Scheme, probeName)
		assert.Equal(t, port, probe.HTTPGet.Port.String(), probeName)
	}
}

func assertPodSecurity(t *testing.T, spec *corev1.PodSpec) {
	t.Helper()
	require.NotNil(t, spec.SecurityContext)
	require.NotNil(t, spec.SecurityContext.RunAsNonRoot)
	assert.True(t, *spec.SecurityContext.RunAsNonRoot)
	require.NotNil(t, spec.SecurityContext.RunAsUser)
	assert.NotZero(t, *spec.SecurityContext.RunAsUser)
	require.NotNil(t, spec.SecurityContext.SeccompProfile)
	assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, spec.SecurityContext.SeccompProfile.Type)
	require.Len(t, spec.Containers, 2, "the program and its kube-rbac-proxy")
	for _, c := range spec.Containers {
		sc := c.SecurityContext
		require.NotNil(t, sc, c.Name)
		assert.Equal(t, new(false), sc.AllowPrivilegeEscalation, c.Name)
		assert.Equal(t, new(true), sc.ReadOnlyRootFilesystem, c.Name)
		assert.Equal(t, new(true), sc.RunAsNonRoot, c.Name)
		require.NotNil(t, sc.Capabilities, c.Name)
		assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop, c.Name)
		assert.Empty(t, sc.Capabilities.Add, c.Name)
		assert.Nil(t, sc.Privileged, c.Name)
		require.NotNil(t, c.Resources.Requests, c.Name)
		assert.False(t, c.Resources.Requests.Cpu().IsZero(), "%s requests CPU", c.Name)
		assert.False(t, c.Resources.Requests.Memory().IsZero(), "%s requests memory", c.Name)
		assert.False(t, c.Resources.Limits.Memory().IsZero(), "%s limits memory", c.Name)
	}
}

// assertCredentialRoles checks that each namespace with referenced credential Secrets gets a Role
// that grants read on exactly those names, bound to the agent, and no other namespace does.
func assertCredentialRoles(t *testing.T, objs bundle.Objects, want map[string][]string) {
	t.Helper()
	const name = "d8:service-with-healthchecks:agent-credentials"
	got := map[string][]string{}
	for _, obj := range objs.OfKind("Role") {
		if obj.GetName() != name {
			continue
		}
		role := &rbacv1.Role{}
		require.NoError(t, bundle.Convert(obj, role))
		require.Len(t, role.Rules, 1)
		r := role.Rules[0]
		assert.Equal(t, []string{""}, r.APIGroups)
		assert.Equal(t, []string{"secrets"}, r.Resources)
		assert.Equal(t, []string{"get", "list", "watch"}, r.Verbs)
		got[role.Namespace] = r.ResourceNames

		binding := &rbacv1.RoleBinding{}
		require.NoError(t, bundle.Convert(objs.Get("RoleBinding", role.Namespace, name), binding))
		assert.Equal(t, name, binding.RoleRef.Name)
		assert.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Name: "agent", Namespace: bundle.Namespace}}, binding.Subjects)
	}
	if want == nil {
		want = map[string][]string{}
	}
	assert.Equal(t, want, got)
}

// assertNoSecretAccessOutsideCredentialRoles: no ClusterRole and no other Role mentions Secrets.
func assertNoSecretAccessOutsideCredentialRoles(t *testing.T, objs bundle.Objects) {
	t.Helper()
	for _, kind := range []string{"ClusterRole", "Role"} {
		for _, obj := range objs.OfKind(kind) {
			if kind == "Role" && obj.GetName() == "d8:service-with-healthchecks:agent-credentials" {
				continue
			}
			role := &rbacv1.ClusterRole{}
			require.NoError(t, bundle.Convert(obj, role))
			for _, r := range role.Rules {
				assert.False(t, slices.Contains(r.Resources, "secrets") || slices.Contains(r.Resources, "*"),
					"%s %s/%s must not grant Secrets: %+v", kind, obj.GetNamespace(), obj.GetName(), r)
			}
		}
	}
}

func nilIfEmpty(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return m
}

func intString(i int32) string {
	return strconv.Itoa(int(i))
}

// portNumber resolves a named container port to its number.
func portNumber(t *testing.T, c *corev1.Container, port string) string {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == port {
			return intString(p.ContainerPort)
		}
	}
	return port
}
