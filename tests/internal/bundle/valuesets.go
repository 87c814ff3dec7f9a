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
	ControllerDigest   = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	AgentDigest        = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
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
					"common": map[string]any{"kubeRbacProxy": KubeRbacProxyDigest},
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
