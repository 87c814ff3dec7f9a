// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"

	"github.com/distribution/reference"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

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

const (
	moduleRegistrySecret   = "service-with-healthchecks-module-registry"
	platformRegistrySecret = "deckhouse-registry"
)

// dockerAuths decodes a registry Secret's .dockerconfigjson into its auths.
func dockerAuths(t *testing.T, objs bundle.Objects, name string) map[string]map[string]any {
	t.Helper()
	obj := objs.Get("Secret", bundle.Namespace, name)
	require.NotNil(t, obj, "the registry Secret %s/%s", bundle.Namespace, name)
	secret := &corev1.Secret{}
	require.NoError(t, bundle.Convert(obj, secret))
	assert.Equal(t, corev1.SecretTypeDockerConfigJson, secret.Type)
	require.Contains(t, secret.Data, corev1.DockerConfigJsonKey)
	var cfg struct {
		Auths map[string]map[string]any `json:"auths"`
	}
	require.NoError(t, json.Unmarshal(secret.Data[corev1.DockerConfigJsonKey], &cfg), "the Secret holds a docker config JSON")
	return cfg.Auths
}

func TestBothPodsPullWithTheRegistrySecrets(t *testing.T) {
	cases := map[string]struct {
		set         bundle.ValueSet
		wantSecrets []string
		wantAuths   map[string][]string
	}{
		"an embedded module pulls with the platform's credentials": {
			set:         bundle.ValueSets()[bundle.SetDefaults],
			wantSecrets: []string{platformRegistrySecret},
			wantAuths:   map[string][]string{platformRegistrySecret: {bundle.GlobalRegistryHost}},
		},
		"an external module pulls with its own registry's credentials and the platform's": {
			set:         bundle.ValueSets()[bundle.SetExternal],
			wantSecrets: []string{moduleRegistrySecret, platformRegistrySecret},
			wantAuths: map[string][]string{
				moduleRegistrySecret:   {bundle.ExternalRegistryHost},
				platformRegistrySecret: {bundle.GlobalRegistryHost},
			},
		},
		"without any dockercfg nothing renders and pulls are anonymous": {
			set: bundle.ValueSets()[bundle.SetNoDockercfg],
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			objs, err := tc.set.Render()
			require.NoError(t, err)
			var secrets []string
			for _, s := range objs.OfKind("Secret") {
				secrets = append(secrets, s.GetName())
			}
			assert.ElementsMatch(t, tc.wantSecrets, secrets)
			// Every registry an image comes from has credentials in one of the pod's Secrets.
			covered := map[string]bool{}
			for secret, hosts := range tc.wantAuths {
				auths := dockerAuths(t, objs, secret)
				assert.ElementsMatch(t, hosts, slices.Collect(maps.Keys(auths)), "the auths of %s", secret)
				for _, h := range hosts {
					covered[h] = true
				}
			}
			var want []corev1.LocalObjectReference
			for _, s := range tc.wantSecrets {
				want = append(want, corev1.LocalObjectReference{Name: s})
			}
			for workload, spec := range podSpecs(t, objs) {
				assert.ElementsMatch(t, want, spec.ImagePullSecrets, workload)
				if len(tc.wantSecrets) == 0 {
					continue
				}
				for _, c := range spec.Containers {
					domain := reference.Domain(parseImage(t, c.Image))
					assert.True(t, covered[domain], "%s/%s is pulled from %s, for which no pull Secret has credentials", workload, c.Name, domain)
				}
			}
		})
	}
}

// TestTheDockercfgsPassThroughUnchanged: the Secrets carry the platform's values byte for byte.
func TestTheDockercfgsPassThroughUnchanged(t *testing.T) {
	objs, err := bundle.ValueSets()[bundle.SetExternal].Render()
	require.NoError(t, err)
	for name, want := range map[string]string{moduleRegistrySecret: bundle.ModuleDockercfg, platformRegistrySecret: bundle.GlobalDockercfg} {
		obj := objs.Get("Secret", bundle.Namespace, name)
		require.NotNil(t, obj, name)
		got, _, err := unstructured.NestedString(obj.Object, "data", corev1.DockerConfigJsonKey)
		require.NoError(t, err)
		assert.Equal(t, want, got, name)
	}
}

// TestBadPackageValuesFailTheRenderWithAMessage: package values that would make every pod fail
// to pull stop the render instead, naming the value. (A malformed dockercfg is refused by the API
// server when the Secret is written: tests/cluster.)
func TestBadPackageValuesFailTheRenderWithAMessage(t *testing.T) {
	cases := map[string]struct {
		set     string
		change  func(values, context map[string]any)
		wantErr string
	}{
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
