// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package dualstack_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// An agent upgraded from the version that named IPv6 slices <resource>-<port>-<node>-ipv6
// finds its old-named slice (its own: labels, annotation and owner say so), publishes the slice
// under the new name with the same endpoints and deletes the old one, created first: the IPv6
// ClusterIP never lacks the pod, and a loop through it (and through the IPv4 one) sees zero
// failures across the restart.
//
// The old version is simulated: with node-a's agent stopped, its IPv6 slice is replaced by a
// copy under the old name, as the old agent would have left it; then the agent starts again.
func TestAnUpgradedAgentRenamesItsOldIPv6SliceWithoutAFlap(t *testing.T) {
	s := shared.Get(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "upgrade")
	labels := map[string]string{"app": "web"}
	a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-a", Node: "node-a", Labels: labels, ContainerPorts: webPorts})
	a.ServeHTTP(t, 8080)
	createResource(t, c, requireDualStack(kit.Resource(ns, "web", labels,
		[]v1alpha1.ServicePort{e2e.ServicePort("http", 80, intstr.FromString("http"))}, kit.HTTPProbe(intstr.FromInt32(8080)))), both)
	current := eventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-a":       {addr(t, a, v4): "TTF"},
		"web-http--node-a-ipv6": {addr(t, a, v6): "TTF"},
	})
	newName := "web-http--node-a-ipv6"
	oldName := slicemeta.SliceKey{Resource: "web", Port: "http", Node: "node-a", AddressType: discoveryv1.AddressTypeIPv6}.LegacyName()
	require.Equal(t, "web-http-node-a-ipv6", oldName)

	require.NoError(t, s.StopAgent(t.Context(), "node-a"))
	agentBack := false
	t.Cleanup(func() {
		if !agentBack {
			_ = s.StartAgent(t.Context(), "node-a")
		}
	})
	published := current[newName]
	old := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: oldName, Labels: published.Labels, Annotations: published.Annotations,
			OwnerReferences: published.OwnerReferences},
		AddressType: published.AddressType,
		Endpoints:   published.Endpoints,
		Ports:       published.Ports,
	}
	require.NoError(t, c.Env.Client.Create(t.Context(), old))
	require.NoError(t, c.Env.Client.Delete(t.Context(), &published))
	eventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-a":      {addr(t, a, v4): "TTF"},
		"web-http-node-a-ipv6": {addr(t, a, v6): "TTF"},
	})
	for _, f := range both {
		c.WaitProgrammedOf(t, ns+"/web", 80, f, a)
	}

	l := startLoops(t, c, ns+"/web", 80, cluster.HTTP, both)
	l.waitAfter(t, time.Now())
	restarted := time.Now()
	require.NoError(t, s.StartAgent(t.Context(), "node-a"))
	agentBack = true
	eventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-a":       {addr(t, a, v4): "TTF"},
		"web-http--node-a-ipv6": {addr(t, a, v6): "TTF"},
	})
	err := c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: oldName}, &discoveryv1.EndpointSlice{})
	assert.True(t, apierrors.IsNotFound(err), "the old-named slice is deleted: %v", err)
	for _, f := range both {
		c.WaitProgrammedOf(t, ns+"/web", 80, f, a)
	}
	// The window: from the restart until the renamed slices have carried a window's worth of
	// requests.
	l.waitAfter(t, time.Now())
	renamed := time.Now()
	l.waitAfter(t, renamed)
	requireNoFailure(t, "an upgraded agent renames its IPv6 slice", l.stop(), restarted, renamed,
		map[corev1.IPFamily][]string{v4: keys(a), v6: keys(a)})
}
