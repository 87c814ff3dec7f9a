// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/platform"
)

// configurationExamples are the ModuleConfigs of docs/CONFIGURATION.md: the one that enables the
// module, and the one that sets everything.
func configurationExamples(t *testing.T) (enabling, full platform.ModuleConfig) {
	t.Helper()
	root, err := bundle.Root()
	require.NoError(t, err)
	md, err := os.ReadFile(filepath.Join(root, "docs", "CONFIGURATION.md"))
	require.NoError(t, err)
	mcs, err := platform.ModuleConfigsIn(md)
	require.NoError(t, err)
	require.Len(t, mcs, 2, "docs/CONFIGURATION.md shows enabling the module, then every setting")
	return mcs[0], mcs[1]
}

// TestFromTheDocumentedModuleConfigsToTheRenderedChart goes from each ModuleConfig of
// docs/CONFIGURATION.md through the settings schema and the hooks to what the chart renders.
func TestFromTheDocumentedModuleConfigsToTheRenderedChart(t *testing.T) {
	enabling, full := configurationExamples(t)
	platformSide := bundle.ValueSet{EnabledModules: bundle.AllPlatformModules}
	cases := map[string]struct {
		mc               platform.ModuleConfig
		global           map[string]any
		wantReplicas     int32
		wantLogLevel     string
		wantNodeSelector map[string]string
		wantTolerations  []corev1.Toleration
	}{
		"enabling alone runs the defaults": {
			mc: enabling, wantReplicas: 2, wantLogLevel: "info", wantTolerations: systemTolerations,
		},
		"enabling on a single-master cluster runs one controller (the settings hook)": {
			mc: enabling, global: map[string]any{"highAvailability": false},
			wantReplicas: 1, wantLogLevel: "info", wantTolerations: systemTolerations,
		},
		"the full example reaches the pods": {
			mc: full, global: map[string]any{"highAvailability": false},
			wantReplicas: 2, wantLogLevel: "info",
			wantNodeSelector: map[string]string{"node-role.example.com/infra": ""},
			wantTolerations: []corev1.Toleration{{
				Key: "dedicated.example.com", Operator: corev1.TolerationOpEqual, Value: "infra", Effect: corev1.TaintEffectNoExecute,
			}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			set := platformSide
			set.Global = tc.global
			values, context, err := platform.Values(t, tc.mc, set, platform.Cluster{})
			require.NoError(t, err)
			rendered, err := bundle.RenderContext(values, context)
			require.NoError(t, err)
			objs := bundle.Objects(rendered)
			ctrl, err := objs.Deployment(bundle.Namespace, "controller")
			require.NoError(t, err)
			require.NotNil(t, ctrl.Spec.Replicas)
			assert.Equal(t, tc.wantReplicas, *ctrl.Spec.Replicas)
			spec := &ctrl.Spec.Template.Spec
			assert.Equal(t, tc.wantNodeSelector, nilIfEmpty(spec.NodeSelector))
			assert.Equal(t, tc.wantTolerations, spec.Tolerations)
			got, ok := bundle.Flag(bundle.Container(spec, "controller"), "log-level")
			require.True(t, ok)
			assert.Equal(t, tc.wantLogLevel, got)
			for flag, setting := range map[string]string{"kube-api-qps": "kubeAPIQPS", "kube-api-burst": "kubeAPIBurst"} {
				got, ok := bundle.Flag(bundle.Container(spec, "controller"), flag)
				require.True(t, ok, flag)
				want := defaultCtrlAPI[flag]
				if s, ok := tc.mc.Spec.Settings["controller"].(map[string]any); ok && s[setting] != nil {
					want = fmt.Sprint(s[setting])
				}
				assert.Equal(t, want, got, "controller --%s", flag)
			}
			agent, err := objs.DaemonSet(bundle.Namespace, "agent")
			require.NoError(t, err)
			for flag, setting := range map[string]string{"probe-concurrency": "probeConcurrency", "max-probe-targets": "maxProbeTargets", "kube-api-qps": "kubeAPIQPS", "kube-api-burst": "kubeAPIBurst"} {
				got, ok := bundle.Flag(bundle.Container(&agent.Spec.Template.Spec, "agent"), flag)
				require.True(t, ok, flag)
				want := defaultAgentFlags[flag]
				if s, ok := tc.mc.Spec.Settings["agent"].(map[string]any); ok && s[setting] != nil {
					want = fmt.Sprint(s[setting])
				}
				assert.Equal(t, want, got, "--%s", flag)
			}
		})
	}
}

// TestTheCredentialsHookTurnsReferencesIntoRoles: with a resource that references a credential
// Secret in the cluster, the hook's values become a Role for exactly that Secret.
func TestTheCredentialsHookTurnsReferencesIntoRoles(t *testing.T) {
	enabling, _ := configurationExamples(t)
	swh := &v1alpha1.ServiceWithHealthchecks{
		TypeMeta:   metav1.TypeMeta{APIVersion: "network.deckhouse.io/v1alpha1", Kind: "ServiceWithHealthchecks"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "db"},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{Healthcheck: &v1alpha1.Healthcheck{Probes: []v1alpha1.Probe{
			{Mode: v1alpha1.ProbeModePostgreSQL, PostgreSQL: &v1alpha1.PostgreSQLProbe{TargetPort: intstr.FromInt32(5432), AuthSecretName: "pg"}},
			{Mode: v1alpha1.ProbeModePostgreSQL, PostgreSQL: &v1alpha1.PostgreSQLProbe{TargetPort: intstr.FromInt32(5432), AuthSecretName: "pg-gone"}},
		}}},
	}
	secret := &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "pg"},
		Type:       wellknown.SecretTypePostgreSQLCredentials,
		Data:       map[string][]byte{"user": []byte("app"), "password": []byte("pw")},
	}
	values, context, err := platform.Values(t, enabling, bundle.ValueSet{}, platform.Cluster{
		Resources: []runtime.Object{swh}, Secrets: []runtime.Object{secret},
	})
	require.NoError(t, err)
	rendered, err := bundle.RenderContext(values, context)
	require.NoError(t, err)
	assertCredentialRoles(t, bundle.Objects(rendered), map[string][]string{"team-a": {"pg"}})
	problems := values[bundle.ValuesKey].(map[string]any)["internal"].(map[string]any)["credentialProblems"].([]any)
	require.Len(t, problems, 1, "the missing Secret is reported")
	assert.Equal(t, "pg-gone", problems[0].(map[string]any)["name"])
}

func TestModuleConfigsThePlatformRefusesRenderNothing(t *testing.T) {
	enabling, _ := configurationExamples(t)
	cases := map[string]struct {
		change  func(*platform.ModuleConfig)
		wantErr string
	}{
		"an unknown setting": {
			change:  func(mc *platform.ModuleConfig) { mc.Spec.Settings = map[string]any{"loglevel": "Debug"} },
			wantErr: "loglevel",
		},
		"a setting of the wrong type": {
			change: func(mc *platform.ModuleConfig) {
				mc.Spec.Settings = map[string]any{"agent": map[string]any{"probeConcurrency": "many"}}
			},
			wantErr: "probeConcurrency",
		},
		"a ModuleConfig of another module": {
			change:  func(mc *platform.ModuleConfig) { mc.Metadata.Name = "service-with-health-checks" },
			wantErr: `the module reads only "service-with-healthchecks"`,
		},
		"a disabled module": {
			change:  func(mc *platform.ModuleConfig) { mc.Spec.Enabled = new(false) },
			wantErr: platform.ErrNotEnabled.Error(),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			mc := enabling
			tc.change(&mc)
			_, _, err := platform.Values(t, mc, bundle.ValueSet{}, platform.Cluster{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}
