package cluster

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

func TestEveryRenderedObjectPassesServerSideDryRun(t *testing.T) {
	// What exists before the module renders: the platform's monitoring namespace, the users'
	// namespaces, and the module namespace (the chart's first object).
	for _, ns := range []string{bundle.Namespace, bundle.MonitoringNamespace, bundle.CredentialsNSA, bundle.CredentialsNSB} {
		ensureNamespace(t, ns)
	}
	for name, set := range bundle.ValueSets() {
		t.Run(name, func(t *testing.T) {
			objs := render(t, set)
			require.NotEmpty(t, objs)
			kinds := objs.Counts()
			for _, obj := range objs {
				assert.NoError(t, write(t.Context(), obj, true), "server-side dry-run")
			}
			if set.EnabledModules != nil {
				assert.Equal(t, 2, kinds["PodMonitor"], "the monitoring kinds went through the API server too")
				assert.Equal(t, 2, kinds["VerticalPodAutoscaler"], "the autoscaling kinds went through the API server too")
			}
		})
	}
}

// TestDryRunCatchesSchemaErrors proves the dry-run above can fail: an object with a field its
// kind does not have is rejected.
func TestDryRunCatchesSchemaErrors(t *testing.T) {
	ensureNamespace(t, bundle.Namespace)
	ensureNamespace(t, bundle.MonitoringNamespace)
	objs := render(t, bundle.ValueSets()[bundle.SetDefaults])
	for _, kind := range []string{"Deployment", "PodMonitor", "VerticalPodAutoscaler"} {
		obj := objs.OfKind(kind)[0].DeepCopy()
		require.NoError(t, unstructured.SetNestedField(obj.Object, "no-such-field", "spec", "noSuchField"))
		err := write(t.Context(), obj, true)
		require.Error(t, err, kind)
		assert.Contains(t, err.Error(), "noSuchField", kind)
	}
}
