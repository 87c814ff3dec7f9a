// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// TestTheAuditReadsANodesPodsOncePerNamespaceAndNode: a controller that starts with five honest
// slices of five resources on one node audits all five with one LIST of the node's Pods (the
// same LIST serves every slice of the namespace and node), not five; a forged slice that
// arrives on that node later is still read again, confirmed and deleted, and the honest ones
// stay.
func TestTheAuditReadsANodesPodsOncePerNamespaceAndNode(t *testing.T) {
	const n = 5
	ns := env.CreateNamespaceForTest(t, "audit-batch")
	nodeName := ns + "-node-a"
	node(t, nodeName)
	honest := make([]*discoveryv1.EndpointSlice, 0, n)
	var firstPod = runningPod(t, ns, "r0-p", nodeName, "10.3.0.1", map[string]string{"app": "r0"})
	for i := range n {
		name := fmt.Sprintf("r%d", i)
		swh := newResource(ns, name, func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Selector = map[string]string{"app": name} })
		create(t, swh)
		pod := firstPod
		if i > 0 {
			pod = runningPod(t, ns, name+"-p", nodeName, fmt.Sprintf("10.3.0.%d", i+1), map[string]string{"app": name})
		}
		honest = append(honest, slice(t, ns, name, swh.UID, "http", nodeName, withEndpoints(endpointOf(pod, pod.Status.PodIP, nodeName))))
	}

	reads := &podReads{prefix: "/api/v1/namespaces/" + ns + "/pods"}
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(reads.RoundTrip)
	run := startControllerOn(t, cfg, ns, func(o *Options) { o.SkipAudit = false })
	audited := func() int64 { return int64(testutil.ToFloat64(run.metrics.AuditedSlices)) }
	require.Eventually(t, func() bool { return audited() >= n }, wait, tick, "every slice is audited")
	assert.Equal(t, int64(1), reads.n.Load(), "one LIST of the node's Pods audits the %d slices of the namespace and node", n)

	// A forged slice arrives on the node: its endpoint names r0's Pod with an address that is not
	// the Pod's.
	forger := newResource(ns, "forger", func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Selector = map[string]string{"app": "r0"} })
	create(t, forger)
	// The audit reads a slice's resource from the cache and leaves a slice whose resource it does
	// not know to the garbage collector: the forger's resource is there before its slice, as an
	// agent only publishes for a resource it has seen.
	require.Eventually(t, func() bool {
		return run.mgr.GetCache().Get(t.Context(), client.ObjectKeyFromObject(forger), &v1alpha1.ServiceWithHealthchecks{}) == nil
	}, wait, tick, "the controller's cache has the forger's resource")
	forged := slice(t, ns, "forger", forger.UID, "http", nodeName, withEndpoints(endpointOf(firstPod, "10.9.9.9", nodeName)))
	gone(t, forged, "the forged slice is deleted")
	countsTo(t, run.metrics.ForgedSlices, 1)
	for _, s := range honest {
		require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(s), &discoveryv1.EndpointSlice{}), "honest slice %s stays", s.Name)
	}
}

// TestTheAuditLooksAgainAtASliceWhoseResourceItsCacheHasNotSeen: the audit reads a slice's
// resource from its cache. A slice that arrives while that cache does not hold its resource yet
// (a resource created just before its slice, a cache behind the API server) is looked at again,
// not left unaudited until its next change: once the cache has the resource, the forged slice
// is confirmed and deleted. Only the audit's reads lag here (the garbage collector sees the
// resource and keeps the slice); the API server and everything else are real.
func TestTheAuditLooksAgainAtASliceWhoseResourceItsCacheHasNotSeen(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "audit-lag")
	nodeName := ns + "-node-a"
	node(t, nodeName)
	pod := runningPod(t, ns, "p", nodeName, "10.4.0.1", map[string]string{"app": "web"})
	forger := newResource(ns, "forger", func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Selector = map[string]string{"app": "web"} })
	create(t, forger)
	lag := &laggingReader{hidden: client.ObjectKeyFromObject(forger)}
	run := startController(t, ns, func(o *Options) {
		o.SkipAudit = false
		o.auditReader = func(r client.Reader) client.Reader { lag.Reader = r; return lag }
	})
	forged := slice(t, ns, "forger", forger.UID, "http", nodeName, withEndpoints(endpointOf(pod, "10.9.9.9", nodeName)))

	require.Eventually(t, func() bool { return lag.hid.Load() >= 2 }, wait, tick,
		"the audit looks at the slice again while its cache does not hold the resource")
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(forged), &discoveryv1.EndpointSlice{}),
		"nothing deletes the slice while its resource is unknown to the audit")
	assert.Zero(t, testutil.ToFloat64(run.metrics.ForgedSlices))

	lag.released.Store(true)
	gone(t, forged, "the forged slice is deleted once the audit's cache has its resource")
	countsTo(t, run.metrics.ForgedSlices, 1)
}

// laggingReader hides one resource from the reader it wraps until it is released, and counts
// the reads it answered NotFound.
type laggingReader struct {
	client.Reader
	hidden   client.ObjectKey
	released atomic.Bool
	hid      atomic.Int64
}

func (l *laggingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*v1alpha1.ServiceWithHealthchecks); ok && key == l.hidden && !l.released.Load() {
		l.hid.Add(1)
		return apierrors.NewNotFound(v1alpha1.GroupVersion.WithResource("servicewithhealthchecks").GroupResource(), key.Name)
	}
	return l.Reader.Get(ctx, key, obj, opts...)
}
