// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/audit"
)

// gatedReader records, in order, the slices whose audit begins (an audit's first read is its
// slice from the cache) and, while the gate is closed, holds those reads: the workers stop with
// the slice they took, and what is written meanwhile waits in the audit's queue.
type gatedReader struct {
	client.Reader
	mu     sync.Mutex
	order  []types.NamespacedName
	closed chan struct{} // nil: open
}

func (r *gatedReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*discoveryv1.EndpointSlice); ok {
		r.mu.Lock()
		r.order = append(r.order, key)
		gate := r.closed
		r.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

// close holds the audits that begin from now on; it returns where they start in order.
func (r *gatedReader) close() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = make(chan struct{})
	return len(r.order)
}

func (r *gatedReader) open() {
	r.mu.Lock()
	defer r.mu.Unlock()
	close(r.closed)
	r.closed = nil
}

func (r *gatedReader) since(start int) []types.NamespacedName {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.order[start:])
}

// queuedSet records the slices the audit's queue took in, by node.
type queuedSet struct {
	mu     sync.Mutex
	byNode map[string]map[types.NamespacedName]bool
}

func (q *queuedSet) add(req reconcile.Request, node string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.byNode[node] == nil {
		q.byNode[node] = map[types.NamespacedName]bool{}
	}
	q.byNode[node][req.NamespacedName] = true
}

func (q *queuedSet) has(node string, key types.NamespacedName) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.byNode[node][key]
}

// TestFairAuditAFloodingNodeDoesNotDelayAnotherNodesForgery: a node writes a flood of forged
// slices (each naming a Pod that does not exist), then another node writes one forged slice.
// The audit's workers are held (gatedReader) until both are queued, so the order the audit takes
// them in is the queue's alone. The audit serves nodes round-robin: the victim node's slice is
// audited after at most one flood slice per worker (held when the gate closed) plus one per
// flooding node, not after the flood (a first-in-first-out queue audits all 200 first), and it
// is deleted with an Event naming its node. Positive control: the honest slices of both nodes
// are kept, and the flood is deleted too.
func TestFairAuditAFloodingNodeDoesNotDelayAnotherNodesForgery(t *testing.T) {
	const flood = 200
	ns := env.CreateNamespaceForTest(t, "fair")
	gated := &gatedReader{}
	queued := &queuedSet{byNode: map[string]map[types.NamespacedName]bool{}}
	var log *auditLog
	startController(t, ns, func(o *Options) {
		o.SkipAudit = false
		log = newAuditLog(o)
		o.auditReader = func(r client.Reader) client.Reader { gated.Reader = r; return gated }
		o.onAuditQueued = queued.add
	})
	swh := auditedResource(t, ns)
	flooder, victim := ns+"-flooder", ns+"-victim"
	node(t, flooder)
	node(t, victim)
	sel := map[string]string{"app": "web"}
	podF := runningPod(t, ns, "web-f", flooder, "10.7.0.1", sel)
	podV := runningPod(t, ns, "web-v", victim, "10.7.1.1", sel)
	honest := []*discoveryv1.EndpointSlice{
		slice(t, ns, "web", swh.UID, "http", flooder, withEndpoints(endpointOf(podF, "10.7.0.1", flooder))),
		slice(t, ns, "web", swh.UID, "http", victim, withEndpoints(endpointOf(podV, "10.7.1.1", victim))),
	}
	for _, s := range honest {
		log.audited(t, s, "the honest slice is audited")
	}

	start := gated.close()
	ghost := func(name, ip, nodeName string) discoveryv1.Endpoint {
		return endpointOf(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(name)}}, ip, nodeName)
	}
	// The flood, written as fast as four writers go.
	floodKeys := make([]types.NamespacedName, flood)
	errs := make([]error, flood)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < flood; i += 4 {
				s := newSlice(ns, "web", swh.UID, "http", flooder, chunkNamed("http", flooder, i+1),
					withEndpoints(ghost(fmt.Sprintf("ghost-%d", i), fmt.Sprintf("10.7.%d.%d", 100+i/200, i%200+1), flooder)))
				floodKeys[i], errs[i] = client.ObjectKeyFromObject(s), env.Client.Create(t.Context(), s)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	forged := slice(t, ns, "web", swh.UID, "http", victim, chunkNamed("http", victim, 1), withEndpoints(ghost("nobody", "10.7.9.9", victim)))
	forgedKey := client.ObjectKeyFromObject(forged)
	require.Eventually(t, func() bool {
		if !queued.has(victim, forgedKey) {
			return false
		}
		for _, k := range floodKeys {
			if !queued.has(flooder, k) {
				return false
			}
		}
		return true
	}, wait, tick, "the flood and the victim's slice are queued under their nodes")
	gated.open()

	gone(t, forged, "the victim node's forgery is deleted")
	order := gated.since(start)
	at := slices.Index(order, forgedKey)
	require.GreaterOrEqual(t, at, 0, "the victim's slice was audited")
	floodBefore := 0
	for _, k := range order[:at] {
		if slices.Contains(floodKeys, k) {
			floodBefore++
		}
	}
	t.Logf("the victim's forgery was audited after %d of the %d flood slices", floodBefore, flood)
	// Round-robin: the workers hold one flood slice each when the gate closes; once it opens,
	// the queue serves the flooding node once, then the victim.
	assert.LessOrEqual(t, floodBefore, audit.DefaultWorkers+1, "one flood audit per worker held and one per flooding node, not the flood")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.NotEmpty(c, nodeEvents(t, victim, "ConfirmForgery"), "the victim node's Event names it")
	}, wait, tick)

	for _, k := range floodKeys {
		gone(t, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}, "the flood is deleted too")
	}
	for _, s := range honest {
		require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(s), &discoveryv1.EndpointSlice{}), "honest slice %s stays", s.Name)
	}
}
