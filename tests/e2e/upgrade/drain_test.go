// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package upgrade_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

// drainRelease is the release whose agent publishes a drained serving pod with the old triple
// (ready=false, serving=true, terminating=false); HEAD publishes terminating=true and rewrites
// the slices that release wrote on its first reconcile (CHANGELOG.md, v0.3.0).
const drainRelease = "0.2.0"

// TestReleaseUpgradeRewritesADrainedEndpoint runs the previous release (the newest whose
// product differs from HEAD's) with the chart's RBAC and policies, drains a serving pod
// (network.deckhouse.io/drain: "*"), waits for the previous agent's verdict on it, upgrades to
// HEAD as the platform does, and asserts that HEAD's agents publish the drained endpoint
// ready=false, serving=true, terminating=true while every other pod stays ready. When the
// previous release is drainRelease, its slice must have said terminating=false first: HEAD's
// agent rewrote it. It then rolls back to the previous release and asserts that its agents
// publish the drained endpoint with the triple they published before the upgrade.
func TestReleaseUpgradeRewritesADrainedEndpoint(t *testing.T) {
	cluster.SkipUnlessIsolated(t)
	prev := sources(t)[0]
	old, head := versions(t, prev)
	c := cluster.Start(t, cluster.Options{
		Nodes:        []cluster.Node{{Name: "node-a", Zone: "zone-a"}, {Name: "node-b", Zone: "zone-b"}},
		KubeProxy:    true,
		ControlPlane: controlplane.Options{SkipModuleCRDs: true, ExtraCRDPaths: []string{old.CRD}},
	})
	applyAccess(t, c, old.Access, nil)
	waitPoliciesInForce(t, c, old.Access)
	kubeconfigs := programKubeconfigs(t, c, stack.DefaultControllers)
	s := stack.Start(t, stack.Options{Cluster: c, Binaries: &old.Bins, ControllerArgs: old.ControllerArgs, AgentArgs: old.AgentArgs,
		Kubeconfigs: func(program string) string { return kubeconfigs[program] }})
	ctx := t.Context()
	ns := c.Env.CreateNamespaceForTest(t, "drain")
	ports := examplePorts(t, filepath.Join(old.ExampleDir, exampleFile))
	pods := startPods(t, c, ns)
	require.NoError(t, s.ApplyFile(ctx, ns, filepath.Join(old.ExampleDir, exampleFile)))
	web := ports[0].Resource
	for _, p := range pods {
		requireTriple(t, c, ns, web, p, "T/T/F")
	}

	drained := pods[0]
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"*"}}}`, wellknown.AnnotationDrain)
	require.NoError(t, c.Env.Client.Patch(ctx, &corev1.Pod{ObjectMeta: objectMeta(ns, drained.Name)}, client.RawPatch(types.MergePatchType, []byte(patch))))
	before := requireTriple(t, c, ns, web, drained, "")
	t.Logf("v%s publishes the drained %s as ready/serving/terminating %s", prev.Version, drained.Key(), before)
	if prev.Version == drainRelease {
		assert.Equal(t, "F/T/F", before, "v%s's triple for a drained serving pod", prev.Version)
	}

	targets := len(resourcesOf(ports)) * podsPerNode
	replace(t, s, "upgrade to HEAD", head, old, targets)
	requireTriple(t, c, ns, web, drained, "F/T/T")
	for _, p := range pods[1:] {
		requireTriple(t, c, ns, web, p, "T/T/F")
	}

	// The rollback (docs/UPGRADE.md, "From v0.3.0 back to v0.2.0"): the previous release's agents
	// publish the drained pod with their own triple again.
	replace(t, s, "rollback to v"+prev.Version, old, head, targets)
	after := requireTriple(t, c, ns, web, drained, "")
	assert.Equal(t, before, after, "after the rollback, v%s publishes the drained %s with its own triple again", prev.Version, drained.Key())
	for _, p := range pods[1:] {
		requireTriple(t, c, ns, web, p, "T/T/F")
	}
}

// requireTriple waits until pod's endpoint in the slices of resource settles on want
// ("ready/serving/terminating", each T or F; "" for any decided triple other than all ready)
// and returns it.
func requireTriple(t *testing.T, c *cluster.Cluster, ns, resource string, pod *cluster.Pod, want string) string {
	t.Helper()
	var got string
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		var list discoveryv1.EndpointSliceList
		require.NoError(ct, c.Env.Client.List(t.Context(), &list, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: resource}))
		got = ""
		for _, s := range list.Items {
			for _, e := range s.Endpoints {
				if len(e.Addresses) > 0 && e.Addresses[0] == pod.IP.String() {
					got = flag(e.Conditions.Ready) + "/" + flag(e.Conditions.Serving) + "/" + flag(e.Conditions.Terminating)
				}
			}
		}
		if want == "" {
			assert.NotContains(ct, []string{"", "T/T/F"}, got, "%s's endpoint in %s changed", pod.Key(), resource)
			return
		}
		assert.Equal(ct, want, got, "%s's endpoint in %s", pod.Key(), resource)
	}, kit.WaitFor, kit.Poll)
	return got
}

// flag is T for a condition set true, F otherwise.
func flag(b *bool) string {
	if b != nil && *b {
		return "T"
	}
	return "F"
}

// objectMeta names an object.
func objectMeta(namespace, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: namespace, Name: name}
}
