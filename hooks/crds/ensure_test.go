// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package crds_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/deckhouse/deckhouse/pkg/log"
	"github.com/deckhouse/module-sdk/common-hooks/ensure_crds"
	"github.com/deckhouse/module-sdk/pkg"
	"github.com/deckhouse/module-sdk/testing/mock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/hooks/crds"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

func TestGlobFindsTheBundlesCRDsBesideTheBinary(t *testing.T) {
	t.Setenv(crds.GlobEnv, "")
	exe, err := os.Executable()
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(filepath.Dir(exe), "..", "crds", "*.yaml"), crds.Glob())

	t.Setenv(crds.GlobEnv, "/somewhere/crds/*.yaml")
	assert.Equal(t, "/somewhere/crds/*.yaml", crds.Glob())
}

// kubeClient is what module-sdk hands hooks: a controller-runtime client plus a dynamic one.
type kubeClient struct {
	client.Client
	dyn dynamic.Interface
}

func (k kubeClient) Dynamic() dynamic.Interface { return k.dyn }

func TestEnsureInstallsTheModuleCRDOnARealAPIServer(t *testing.T) {
	env := controlplane.StartForTest(t, controlplane.Options{SkipModuleCRDs: true})
	root, err := controlplane.RepoRoot()
	require.NoError(t, err)
	dyn, err := dynamic.NewForConfig(env.Config)
	require.NoError(t, err)
	scheme := controlplane.NewScheme()
	require.NoError(t, apiextensionsv1.AddToScheme(scheme))
	c, err := client.New(env.Config, client.Options{Scheme: scheme})
	require.NoError(t, err)
	dc := mock.NewDependencyContainerMock(t)
	dc.GetK8sClientMock.Return(kubeClient{Client: c, dyn: dyn}, nil)

	err = c.List(t.Context(), &v1alpha1.ServiceWithHealthchecksList{})
	require.Error(t, err, "the API server must not know the kind before the hook runs")

	handler := ensure_crds.EnsureCRDsHandler(filepath.Join(root, "crds", "*.yaml"))
	input := &pkg.HookInput{DC: dc, Logger: log.NewNop()}
	require.NoError(t, handler(t.Context(), input))
	// A second start finds the CRD in place and updates it.
	require.NoError(t, handler(t.Context(), input))

	crd := &apiextensionsv1.CustomResourceDefinition{}
	require.NoError(t, c.Get(t.Context(), client.ObjectKey{Name: "servicewithhealthchecks.network.deckhouse.io"}, crd))
	assert.Equal(t, "deckhouse", crd.Labels["heritage"])
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.NoError(ct, c.List(t.Context(), &v1alpha1.ServiceWithHealthchecksList{}))
	}, 30*time.Second, 100*time.Millisecond, "the kind is served once the CRD is established")
}
