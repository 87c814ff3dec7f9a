// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
)

// The reconciler's memory between reconciles, one small type per concern, each with its own
// lock: nothing here is read or written together with another of them.

// workQueue holds the controller's work queue once the controller has started (the raw source
// hands it over): the queueings of result changes and of Event windows go to it.
type workQueue struct {
	mu sync.Mutex
	q  workqueue.TypedRateLimitingInterface[reconcile.Request]
}

func (w *workQueue) set(q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.q = q
}

// get is the work queue, nil before the controller started.
func (w *workQueue) get() workqueue.TypedRateLimitingInterface[reconcile.Request] {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.q
}

// secretReferences are the credential Secrets each resource's probes reference on this node.
type secretReferences struct {
	mu         sync.Mutex
	byResource map[types.NamespacedName][]types.NamespacedName
}

func newSecretReferences() *secretReferences {
	return &secretReferences{byResource: map[types.NamespacedName][]types.NamespacedName{}}
}

// set records the references of a resource (none: it has none) and returns the union of all
// resources' references, and whether the resource's changed.
func (s *secretReferences) set(res types.NamespacedName, refs []types.NamespacedName) ([]types.NamespacedName, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := !slices.Equal(s.byResource[res], refs)
	if len(refs) == 0 {
		delete(s.byResource, res)
	} else {
		s.byResource[res] = refs
	}
	set := map[types.NamespacedName]struct{}{}
	for _, rs := range s.byResource {
		for _, ref := range rs {
			set[ref] = struct{}{}
		}
	}
	return slices.Collect(maps.Keys(set)), changed
}

// referencing are the resources whose probes reference a credential Secret.
func (s *secretReferences) referencing(secret types.NamespacedName) []types.NamespacedName {
	s.mu.Lock()
	defer s.mu.Unlock()
	var hit []types.NamespacedName
	for res, refs := range s.byResource {
		if slices.Contains(refs, secret) {
			hit = append(hit, res)
		}
	}
	return hit
}

// endpointGauges count, per resource, the endpoints this agent has in the API server by state:
// the swh_agent_endpoints gauge is their sum.
type endpointGauges struct {
	metrics    *metrics.Metrics
	mu         sync.Mutex
	byResource map[types.NamespacedName]map[string]int
}

func newEndpointGauges(m *metrics.Metrics) *endpointGauges {
	return &endpointGauges{metrics: m, byResource: map[types.NamespacedName]map[string]int{}}
}

// set records the counts of a resource (none: forgets it) and publishes the sums.
func (g *endpointGauges) set(res types.NamespacedName, counts map[string]int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(counts) == 0 {
		delete(g.byResource, res)
	} else {
		g.byResource[res] = counts
	}
	total := map[string]int{}
	for _, c := range g.byResource {
		for k, v := range c {
			total[k] += v
		}
	}
	for _, s := range []string{metrics.StateReady, metrics.StateNotReady, metrics.StateTerminating} {
		g.metrics.Endpoints.WithLabelValues(s).Set(float64(total[s]))
	}
}

// ownWrites are, by slice, the resourceVersion of this agent's last write of it whose watch
// event has not come yet.
type ownWrites struct {
	mu sync.Mutex
	rv map[types.NamespacedName]string
}

func newOwnWrites() *ownWrites { return &ownWrites{rv: map[types.NamespacedName]string{}} }

// note records the slices a reconcile wrote, by the resourceVersion the API server gave each.
func (w *ownWrites) note(written map[string]*discoveryv1.EndpointSlice) {
	if len(written) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range written {
		if s.ResourceVersion != "" {
			w.rv[client.ObjectKeyFromObject(s)] = s.ResourceVersion
		}
	}
}

// consume tells whether a slice event shows the version this agent's last write of the slice
// returned. Any event of the slice consumes the record, so it holds at most one entry per slice
// this agent writes: a later write of someone else, or an event that came before the write's
// response was recorded, reconciles as before.
func (w *ownWrites) consume(o client.Object) bool {
	key := client.ObjectKeyFromObject(o)
	w.mu.Lock()
	defer w.mu.Unlock()
	rv, ok := w.rv[key]
	if !ok {
		return false
	}
	delete(w.rv, key)
	return rv == o.GetResourceVersion()
}

// nodeWait is set when a reconcile found no Node of this agent: its appearance then reconciles
// every resource (resourcesOfNode).
type nodeWait struct{ unknown atomic.Bool }

// missing records that a reconcile found no Node.
func (n *nodeWait) missing() { n.unknown.Store(true) }

// take tells whether a reconcile found no Node since the last take.
func (n *nodeWait) take() bool { return n.unknown.Swap(false) }
