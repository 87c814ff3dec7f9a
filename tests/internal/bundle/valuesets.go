package bundle

import (
	"fmt"
)

// ValueSet is one configuration of the module: what the user set, what the hooks computed and
// what the platform knows about the cluster.
type ValueSet struct {
	// Settings are the ModuleConfig's settings before defaults.
	Settings map[string]any
	// Internal are the values the hooks write.
	Internal map[string]any
	// EnabledModules are the platform modules that are on.
	EnabledModules []string
	// SystemNodes is how many nodes carry the system role.
	SystemNodes int
}

// Digests of the test images.
const (
	ControllerDigest    = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	AgentDigest         = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	KubeRbacProxyDigest = "sha256:3333333333333333333333333333333333333333333333333333333333333333"
	// RegistryBase is the test registry.
	RegistryBase = "registry.example.com/deckhouse/modules/service-with-healthchecks"
)

// Values builds the whole values tree: the settings with the schema's defaults applied, the
// internal values on top (after their own defaults), and the global values.
func (v ValueSet) Values() (map[string]any, error) {
	schema, err := SchemaMap("values.yaml")
	if err != nil {
		return nil, err
	}
	module, _ := deepCopy(orEmpty(v.Settings)).(map[string]any)
	internal, _ := deepCopy(orEmpty(v.Internal)).(map[string]any)
	module["internal"] = internal
	ApplyDefaults(schema, module)

	enabled := make([]any, 0, len(v.EnabledModules))
	for _, m := range v.EnabledModules {
		enabled = append(enabled, m)
	}
	return map[string]any{
		"global": map[string]any{
			"enabledModules": enabled,
			"discovery": map[string]any{
				"d8SpecificNodeCountByRole": map[string]any{"system": v.SystemNodes},
			},
			"modulesImages": map[string]any{
				"registry": map[string]any{"base": RegistryBase},
				"digests": map[string]any{
					"common":  map[string]any{"kubeRbacProxy": KubeRbacProxyDigest},
					ValuesKey: map[string]any{"controller": ControllerDigest, "agent": AgentDigest},
				},
			},
		},
		ValuesKey: module,
	}, nil
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

// ImageRef is the reference the chart must render for a digest.
func ImageRef(digest string) string {
	return fmt.Sprintf("%s@%s", RegistryBase, digest)
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
				"agent":          map[string]any{"probeConcurrency": 200, "kubeAPIQPS": 50, "kubeAPIBurst": 100},
			},
			EnabledModules: AllPlatformModules,
		},
		SetNoPlatform: {},
	}
}
