// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package bundle

import (
	"encoding/base64"
	"encoding/json"
	"strings"
)

// Delivery is how Deckhouse delivers the module, which decides where its images come from
// (development/PACKAGING.md, "Values Deckhouse passes").
type Delivery string

// Deliveries.
const (
	// Embedded: the module ships inside Deckhouse; its images are in the platform's registry,
	// global.modulesImages.registry.base.
	Embedded Delivery = ""
	// External: the module comes from a ModuleSource; Deckhouse writes the source's registry
	// into serviceWithHealthchecks.registry (base without the module's name, dockercfg).
	External Delivery = "external"
	// Package: the platform passes module package values beside .Values (.Module.Package), which
	// name the images.
	Package Delivery = "package"
)

// ValueSet is one configuration of the module: what the user set, what the hooks computed and
// what the platform knows about the cluster and the module's delivery.
type ValueSet struct {
	// Settings are the ModuleConfig's settings before defaults.
	Settings map[string]any
	// Internal are the values the hooks write.
	Internal map[string]any
	// EnabledModules are the platform modules that are on.
	EnabledModules []string
	// SystemNodes is how many nodes carry the system role.
	SystemNodes int
	// Delivery is how the module is delivered (default Embedded).
	Delivery Delivery
	// NoDockercfg leaves out every registry dockercfg (the platform's and the module's).
	NoDockercfg bool
	// Global are further global values of the cluster (highAvailability, ...).
	Global map[string]any
}

// Digests and registries of the test values: placeholders, no real image has them.
const (
	ControllerDigest    = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	AgentDigest         = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	KubeRbacProxyDigest = "sha256:3333333333333333333333333333333333333333333333333333333333333333"
	// PackageControllerDigest and PackageAgentDigest are the digests of Module.Package.Digests,
	// different from the global ones so a test sees which were used.
	PackageControllerDigest = "sha256:4444444444444444444444444444444444444444444444444444444444444444"
	PackageAgentDigest      = "sha256:5555555555555555555555555555555555555555555555555555555555555555"

	// GlobalRegistryBase is global.modulesImages.registry.base: the platform's registry.
	GlobalRegistryBase = "registry.deckhouse.io/deckhouse/ce"
	// GlobalRegistryHost is its host, the key of the platform's dockercfg.
	GlobalRegistryHost = "registry.deckhouse.io"
	// ExternalRegistryBase is serviceWithHealthchecks.registry.base of an external module: the
	// ModuleSource's repository, without the module's name, with the trailing slash a
	// ModuleSource may carry.
	ExternalRegistryBase = "modules.example.com/deckhouse/modules/"
	// ExternalRegistryHost is its host, the key of the module's dockercfg.
	ExternalRegistryHost = "modules.example.com"
	// PackageRepository is Module.Package.Registry.repository.
	PackageRepository = "packages.example.com/deckhouse/packages"
)

// GlobalDockercfg is global.modulesImages.registry.dockercfg: base64 of a docker config with
// credentials for the platform's registry.
var GlobalDockercfg = dockercfg(GlobalRegistryHost, "license-token", "platform-secret")

// ModuleDockercfg is serviceWithHealthchecks.registry.dockercfg of an external module.
var ModuleDockercfg = dockercfg(ExternalRegistryHost, "module-reader", "module-secret")

func dockercfg(host, user, password string) string {
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	cfg, err := json.Marshal(map[string]any{"auths": map[string]any{host: map[string]any{
		"username": user, "password": password, "auth": auth,
	}}})
	if err != nil {
		panic(err)
	}
	return base64.StdEncoding.EncodeToString(cfg)
}

// Values builds the whole values tree as Deckhouse passes it: the settings with the schema's
// defaults applied, the internal values on top (after their own defaults), the platform's
// registry values for an external module, and the global values.
func (v ValueSet) Values() (map[string]any, error) {
	schema, err := SchemaMap("values.yaml")
	if err != nil {
		return nil, err
	}
	module, _ := deepCopy(orEmpty(v.Settings)).(map[string]any)
	internal, _ := deepCopy(orEmpty(v.Internal)).(map[string]any)
	module["internal"] = internal
	ApplyDefaults(schema, module)
	if v.Delivery == External {
		registry := map[string]any{"base": ExternalRegistryBase, "scheme": "https", "ca": ""}
		if !v.NoDockercfg {
			registry["dockercfg"] = ModuleDockercfg
		}
		module["registry"] = registry
	}

	enabled := make([]any, 0, len(v.EnabledModules))
	for _, m := range v.EnabledModules {
		enabled = append(enabled, m)
	}
	registry := map[string]any{
		"base": GlobalRegistryBase, "address": GlobalRegistryHost, "path": "/deckhouse/ce", "scheme": "https",
	}
	if !v.NoDockercfg {
		registry["dockercfg"] = GlobalDockercfg
	}
	global := map[string]any{
		"enabledModules": enabled,
		"discovery": map[string]any{
			"d8SpecificNodeCountByRole": map[string]any{"system": v.SystemNodes},
			"prometheusScrapeInterval":  30,
		},
		"modulesImages": map[string]any{
			"registry": registry,
			"digests": map[string]any{
				"common":  map[string]any{"kubeRbacProxy": KubeRbacProxyDigest},
				ValuesKey: map[string]any{"controller": ControllerDigest, "agent": AgentDigest},
			},
		},
	}
	for k, val := range v.Global {
		global[k] = deepCopy(val)
	}
	return map[string]any{"global": global, ValuesKey: module}, nil
}

// Context is what the platform puts into the render context beside .Values: the module package
// values (.Module.Package) for a Package delivery, nothing otherwise. Registry and Digests are
// maps, the way lib-helm's own test of helm_lib_module_image passes them.
func (v ValueSet) Context() map[string]any {
	if v.Delivery != Package {
		return nil
	}
	return map[string]any{"Module": map[string]any{"Package": map[string]any{
		"Name":     ModuleName,
		"Version":  "v0.1.0",
		"Registry": map[string]any{"name": "packages", "repository": PackageRepository},
		"Digests":  map[string]any{"controller": PackageControllerDigest, "agent": PackageAgentDigest},
	}}}
}

// Render renders the chart with the value set as Deckhouse renders it (values and context).
func (v ValueSet) Render() (Objects, error) {
	values, err := v.Values()
	if err != nil {
		return nil, err
	}
	return RenderContext(values, v.Context())
}

// ModuleImage is the reference the chart must render for one of the module's images, computed
// here from the delivery the way lib-helm's helm_lib_module_image does.
func (v ValueSet) ModuleImage(image string) string {
	digest := map[string]string{"controller": ControllerDigest, "agent": AgentDigest}[image]
	switch v.Delivery {
	case Package:
		digest = map[string]string{"controller": PackageControllerDigest, "agent": PackageAgentDigest}[image]
		return PackageRepository + "/" + ModuleName + "@" + digest
	case External:
		return strings.Trim(ExternalRegistryBase, "/") + "/" + ModuleName + "@" + digest
	default:
		return GlobalRegistryBase + "@" + digest
	}
}

// CommonImage is the reference of the platform's kube-rbac-proxy image.
func CommonImage() string {
	return GlobalRegistryBase + "@" + KubeRbacProxyDigest
}

func orEmpty(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	return m
}

// AllPlatformModules are the platform modules the chart looks at, all on.
var AllPlatformModules = []string{"vertical-pod-autoscaler-crd", "operator-prometheus-crd"}

// CredentialSecrets is internal.credentialSecrets for the given namespace -> names.
func CredentialSecrets(byNamespace ...NamespaceNames) map[string]any {
	list := make([]any, 0, len(byNamespace))
	for _, n := range byNamespace {
		names := make([]any, 0, len(n.Names))
		for _, name := range n.Names {
			names = append(names, name)
		}
		list = append(list, map[string]any{"namespace": n.Namespace, "names": names})
	}
	return map[string]any{"credentialSecrets": list}
}

// NamespaceNames are Secret names in a namespace.
type NamespaceNames struct {
	Namespace string
	Names     []string
}

// Value set names: the configurations the chart is rendered with in every test package.
const (
	SetDefaults    = "the defaults render a highly available controller and an agent on every node"
	SetSingle      = "a single replica drops the anti-affinity"
	SetCredentials = "credential Secrets in two namespaces get one Role each"
	SetPlacement   = "custom placement overrides the system nodes"
	SetSystemNodes = "system nodes take the controller when the cluster has them"
	SetDebug       = "debug settings reach both programs' flags"
	SetNoPlatform  = "without the monitoring and autoscaling modules there are no PodMonitors or VPAs"
	SetExternal    = "a module from a ModuleSource pulls its images from its own registry with its own credentials"
	SetPackage     = "module package values name the module's images"
	SetNoDockercfg = "without any dockercfg the registry Secret is empty and pulls are anonymous"
	SetTenantRules = "narrowed child-Service settings and a short grace render every tenant check and a faster renewal"
	CredentialsNSA = "team-a"
	CredentialsNSB = "team-b"
)

// ValueSets are the configurations the chart is rendered with.
func ValueSets() map[string]ValueSet {
	return map[string]ValueSet{
		SetDefaults: {EnabledModules: AllPlatformModules},
		SetSingle: {
			Settings:       map[string]any{"highAvailability": false},
			Internal:       map[string]any{"controller": map[string]any{"replicas": 1}},
			EnabledModules: AllPlatformModules,
		},
		SetCredentials: {
			Internal: CredentialSecrets(
				NamespaceNames{Namespace: CredentialsNSA, Names: []string{"pg-main", "pg-replica"}},
				NamespaceNames{Namespace: CredentialsNSB, Names: []string{"orders-db"}},
			),
			EnabledModules: AllPlatformModules,
		},
		SetPlacement: {
			Settings: map[string]any{"controller": map[string]any{
				"nodeSelector": map[string]any{"node-role.example.com/infra": ""},
				"tolerations": []any{map[string]any{
					"key": "dedicated.example.com", "operator": "Equal", "value": "infra", "effect": "NoExecute",
				}},
			}},
			EnabledModules: AllPlatformModules,
			SystemNodes:    3,
		},
		SetSystemNodes: {EnabledModules: AllPlatformModules, SystemNodes: 2},
		SetDebug: {
			Settings: map[string]any{
				"logLevel":       "Debug",
				"agentLostGrace": "1m30s",
				"controller":     map[string]any{"kubeAPIQPS": 200, "kubeAPIBurst": 400},
				"agent":          map[string]any{"probeConcurrency": 200, "kubeAPIQPS": 50, "kubeAPIBurst": 100},
			},
			EnabledModules: AllPlatformModules,
		},
		SetNoPlatform: {},
		SetExternal:   {EnabledModules: AllPlatformModules, Delivery: External},
		SetPackage:    {EnabledModules: AllPlatformModules, Delivery: Package},
		SetNoDockercfg: {
			EnabledModules: AllPlatformModules, Delivery: External, NoDockercfg: true,
		},
		SetTenantRules: {
			Settings: map[string]any{
				"agentLostGrace": "8s",
				"childService": map[string]any{
					"externalIPs":         "ServiceCreators",
					"loadBalancerIP":      "Forbidden",
					"types":               []any{"ClusterIP", "LoadBalancer"},
					"loadBalancerClasses": []any{"example.com/internal"},
					"annotations": map[string]any{
						"allowed":   []any{"example.com/*", "team.example.com/owner"},
						"forbidden": []any{"example.com/dangerous"},
					},
				},
			},
			// What the settings hook writes for the grace of 8s (hooks/settings).
			Internal:       map[string]any{"agent": map[string]any{"leaseRenewInterval": "2s"}},
			EnabledModules: AllPlatformModules,
		},
	}
}
