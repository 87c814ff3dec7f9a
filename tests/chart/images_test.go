// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"slices"
	"testing"

	"github.com/distribution/reference"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

const registrySecret = "service-with-healthchecks-module-registry"

// podSpecs are the pod templates of the chart, by workload.
func podSpecs(t *testing.T, objs bundle.Objects) map[string]*corev1.PodSpec {
	t.Helper()
	ctrl, err := objs.Deployment(bundle.Namespace, "controller")
	require.NoError(t, err)
	agent, err := objs.DaemonSet(bundle.Namespace, "agent")
	require.NoError(t, err)
	return map[string]*corev1.PodSpec{"controller": &ctrl.Spec.Template.Spec, "agent": &agent.Spec.Template.Spec}
}

// parseImage parses an image reference the way the container runtime does and requires it to be
// fully qualified and pinned by digest alone.
func parseImage(t *testing.T, ref string) reference.Canonical {
	t.Helper()
	named, err := reference.ParseNamed(ref)
	require.NoError(t, err, "image %q must be a fully qualified reference", ref)
	_, tagged := named.(reference.Tagged)
	assert.False(t, tagged, "image %q must not carry a tag beside its digest", ref)
	canonical, ok := named.(reference.Canonical)
	require.True(t, ok, "image %q must be pinned by digest", ref)
	return canonical
}

// TestEveryImageIsTheOneDeckhouseWouldPull renders the chart with the values Deckhouse passes for
// each way the module is delivered and checks every container's image, parsed by the container
// runtime's reference parser, against the reference lib-helm's helpers build.
func TestEveryImageIsTheOneDeckhouseWouldPull(t *testing.T) {
	cases := map[string]struct {
		set                   bundle.ValueSet
		wantDomain, wantPath  string
		wantController, agent string
	}{
		"an embedded module pulls from the platform's registry": {
			set:        bundle.ValueSets()[bundle.SetDefaults],
			wantDomain: bundle.GlobalRegistryHost, wantPath: "deckhouse/ce",
			wantController: bundle.ControllerDigest, agent: bundle.AgentDigest,
		},
		"an external module pulls from its source's registry under its own name": {
			set:        bundle.ValueSets()[bundle.SetExternal],
			wantDomain: bundle.ExternalRegistryHost, wantPath: "deckhouse/modules/service-with-healthchecks",
			wantController: bundle.ControllerDigest, agent: bundle.AgentDigest,
		},
		"module package values win over the global digests": {
			set:        bundle.ValueSets()[bundle.SetPackage],
			wantDomain: "packages.example.com", wantPath: "deckhouse/packages/service-with-healthchecks",
			wantController: bundle.PackageControllerDigest, agent: bundle.PackageAgentDigest,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			objs, err := tc.set.Render()
			require.NoError(t, err)
			for workload, spec := range podSpecs(t, objs) {
				require.Empty(t, spec.InitContainers, "%s: init containers would need their images checked too", workload)
				for _, c := range spec.Containers {
					ref := parseImage(t, c.Image)
					if c.Name == "kube-rbac-proxy" {
						assert.Equal(t, bundle.CommonImage(), c.Image, "%s: the sidecar is the platform's common image, whatever the delivery", workload)
						assert.Equal(t, bundle.GlobalRegistryHost, reference.Domain(ref))
						assert.Equal(t, bundle.KubeRbacProxyDigest, ref.Digest().String())
						continue
					}
					assert.Equal(t, tc.set.ModuleImage(c.Name), c.Image, "%s/%s", workload, c.Name)
					assert.Equal(t, tc.wantDomain, reference.Domain(ref), "%s/%s registry", workload, c.Name)
					assert.Equal(t, tc.wantPath, reference.Path(ref), "%s/%s repository", workload, c.Name)
					want := map[string]string{"controller": tc.wantController, "agent": tc.agent}[c.Name]
					require.NotEmpty(t, want, "container %s is one of the module's images", c.Name)
					assert.Equal(t, want, ref.Digest().String(), "%s/%s digest", workload, c.Name)
				}
			}
		})
	}
}

// dockerAuths decodes the registry Secret's .dockerconfigjson into its auths.
func dockerAuths(t *testing.T, objs bundle.Objects) map[string]map[string]any {
	t.Helper()
	obj := objs.Get("Secret", bundle.Namespace, registrySecret)
	require.NotNil(t, obj, "the registry Secret %s/%s", bundle.Namespace, registrySecret)
	secret := &corev1.Secret{}
	require.NoError(t, bundle.Convert(obj, secret))
	assert.Equal(t, corev1.SecretTypeDockerConfigJson, secret.Type)
	require.Contains(t, secret.Data, corev1.DockerConfigJsonKey)
	var cfg struct {
		Auths map[string]map[string]any `json:"auths"`
	}
	require.NoError(t, json.Unmarshal(secret.Data[corev1.DockerConfigJsonKey], &cfg), "the Secret holds a docker config JSON")
	require.NotNil(t, cfg.Auths, "the docker config has an auths object")
	return cfg.Auths
}

func TestBothPodsPullWithTheModuleRegistrySecret(t *testing.T) {
	cases := map[string]struct {
		set       bundle.ValueSet
		wantAuths []string
	}{
		"an embedded module's Secret has the platform's credentials": {
			set: bundle.ValueSets()[bundle.SetDefaults], wantAuths: []string{bundle.GlobalRegistryHost},
		},
		"an external module's Secret has its own registry's credentials beside the platform's": {
			set: bundle.ValueSets()[bundle.SetExternal], wantAuths: []string{bundle.ExternalRegistryHost, bundle.GlobalRegistryHost},
		},
		"without any dockercfg the Secret is empty and pulls are anonymous": {
			set: bundle.ValueSets()[bundle.SetNoDockercfg], wantAuths: []string{},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			objs, err := tc.set.Render()
			require.NoError(t, err)
			auths := dockerAuths(t, objs)
			assert.ElementsMatch(t, tc.wantAuths, slices.Collect(maps.Keys(auths)))
			for workload, spec := range podSpecs(t, objs) {
				assert.Equal(t, []corev1.LocalObjectReference{{Name: registrySecret}}, spec.ImagePullSecrets, workload)
				if len(tc.wantAuths) == 0 {
					continue
				}
				for _, c := range spec.Containers {
					domain := reference.Domain(parseImage(t, c.Image))
					assert.Contains(t, auths, domain, "%s/%s is pulled from %s, which the Secret must have credentials for", workload, c.Name, domain)
				}
			}
		})
	}
}

// TestTheModuleCredentialsWinForTheirRegistry: when both dockercfgs name the same registry the
// module's own entry is the one kept.
func TestTheModuleCredentialsWinForTheirRegistry(t *testing.T) {
	set := bundle.ValueSets()[bundle.SetExternal]
	values, err := set.Values()
	require.NoError(t, err)
	module := values[bundle.ValuesKey].(map[string]any)
	module["registry"].(map[string]any)["dockercfg"] = base64.StdEncoding.EncodeToString(
		[]byte(`{"auths":{"` + bundle.GlobalRegistryHost + `":{"auth":"bW9kdWxlOm93bg=="}}}`))
	rendered, err := bundle.Render(values)
	require.NoError(t, err)
	auths := dockerAuths(t, rendered)
	require.Contains(t, auths, bundle.GlobalRegistryHost)
	assert.Equal(t, "bW9kdWxlOm93bg==", auths[bundle.GlobalRegistryHost]["auth"])
}

// TestBadRegistryValuesFailTheRenderWithAMessage: what would make every pod fail to pull stops
// the render instead, naming the value.
func TestBadRegistryValuesFailTheRenderWithAMessage(t *testing.T) {
	cases := map[string]struct {
		set     string
		change  func(values, context map[string]any)
		wantErr string
	}{
		"a dockercfg that is not base64 JSON": {
			set: bundle.SetExternal,
			change: func(values, _ map[string]any) {
				values["global"].(map[string]any)["modulesImages"].(map[string]any)["registry"].(map[string]any)["dockercfg"] = "not base64 at all"
			},
			wantErr: "global.modulesImages.registry.dockercfg is not base64 of a docker config JSON",
		},
		"a module dockercfg whose auths is not an object": {
			set: bundle.SetExternal,
			change: func(values, _ map[string]any) {
				values[bundle.ValuesKey].(map[string]any)["registry"].(map[string]any)["dockercfg"] = base64.StdEncoding.EncodeToString([]byte(`{"auths":["x"]}`))
			},
			wantErr: "serviceWithHealthchecks.registry.dockercfg is not base64 of a docker config JSON",
		},
		"a package without the agent's digest": {
			set: bundle.SetPackage,
			change: func(_, context map[string]any) {
				pkg := context["Module"].(map[string]any)["Package"].(map[string]any)
				delete(pkg["Digests"].(map[string]any), "agent")
			},
			wantErr: "no digest for image agent in Module.Package.Digests",
		},
		"a package without its repository": {
			set: bundle.SetPackage,
			change: func(_, context map[string]any) {
				pkg := context["Module"].(map[string]any)["Package"].(map[string]any)
				pkg["Registry"] = map[string]any{"name": "packages"}
			},
			wantErr: "Module.Package.Registry.repository is not set",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			set := bundle.ValueSets()[tc.set]
			values, err := set.Values()
			require.NoError(t, err)
			context := set.Context()
			tc.change(values, context)
			_, err = bundle.RenderContext(values, context)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}
