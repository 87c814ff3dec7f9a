// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"context"
	"fmt"
	"maps"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/index"
)

// The audit of one slice reads its node's Pods of its namespace in one LIST; the same LIST
// serves every other slice of that namespace and node (development/CONTROLLER.md, "Audit of
// published endpoints"). Without this, the controller's start audits every slice of the cluster
// with a LIST each: 50,000 LISTs at 5,000 nodes with 10 resources on each, where one per
// (namespace, node) suffices.

// version is a slice as it was audited: its UID and resourceVersion.
type version struct {
	uid types.UID
	rv  string
}

// mark is a slice found clean by a sibling's audit: the version, and the epoch of its
// namespace's Pod changes when the LIST it was judged against began.
type mark struct {
	v     version
	epoch uint64
}

// cleanSet remembers the slices found clean by a sibling's audit, at the version audited: the
// slice's own audit at that version has nothing left to read, unless a Pod of its namespace
// changed since the LIST began (a Pod change brings the slices that name it back, and a mark
// made from an older LIST must not answer for them). It holds at most one entry per slice,
// dropped at the slice's next audit or deletion, and one epoch per namespace.
type cleanSet struct {
	mu     sync.Mutex
	m      map[types.NamespacedName]mark
	epochs map[string]uint64
}

func newCleanSet() *cleanSet {
	return &cleanSet{m: map[types.NamespacedName]mark{}, epochs: map[string]uint64{}}
}

func (c *cleanSet) mark(name types.NamespacedName, v version, epoch uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[name] = mark{v: v, epoch: epoch}
}

// take tells whether the slice was found clean at version v against Pods read after its
// namespace's last Pod change, and forgets it either way: a slice written since is audited
// again.
func (c *cleanSet) take(name types.NamespacedName, v version) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	got, ok := c.m[name]
	delete(c.m, name)
	return ok && got.v == v && got.epoch == c.epochs[name.Namespace]
}

// epoch is the count of Pod changes seen in namespace ns.
func (c *cleanSet) epoch(ns string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epochs[ns]
}

// podChanged records a Pod change in namespace ns: every mark made from a LIST that began
// before is void.
func (c *cleanSet) podChanged(ns string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epochs[ns]++
}

func (c *cleanSet) forget(name types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, name)
}

func (c *cleanSet) size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// nodePods is the LIST of slice s's node's Pods of its namespace (podsOnNode), shared by the
// audits of that namespace and node running at once (one LIST for all of them: several workers
// start on the same node's slices together), and followed, in the same flight, by the judgement
// of the node's other slices against it (auditSiblings). An audit joins only a flight begun since
// the last Pod change of the namespace (the flight is keyed by the epoch too): a LIST begun
// before a Pod changed does not answer for it. Each caller gets its own copy of the map (reread
// changes it).
func (a *Auditor) nodePods(ctx context.Context, s *discoveryv1.EndpointSlice, node string) (map[string]*corev1.Pod, error) {
	epoch := a.clean.epoch(s.Namespace)
	v, err, _ := a.flight.Do(fmt.Sprintf("%s/%s/%d", s.Namespace, node, epoch), func() (any, error) {
		pods, err := a.podsOnNode(ctx, s.Namespace, node)
		if err != nil {
			return nil, err
		}
		// A failure here costs only the saving: each sibling is still audited on its own.
		if err := a.auditSiblings(ctx, s, node, pods, epoch); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "auditing the other slices of the node with the same Pods")
		}
		return pods, nil
	})
	if err != nil {
		return nil, err
	}
	shared, _ := v.(map[string]*corev1.Pod)
	return maps.Clone(shared), nil
}

// auditSiblings audits, against pods (the LIST of slice s's node's Pods of its namespace), the
// other slices of that namespace and node in the cache, and marks each one found clean at its
// version. A sibling with a suspect endpoint is left to its own audit, which reads its Pods again
// and confirms over the window; nothing is deleted here.
func (a *Auditor) auditSiblings(ctx context.Context, s *discoveryv1.EndpointSlice, node string, pods map[string]*corev1.Pod, epoch uint64) error {
	var siblings discoveryv1.EndpointSliceList
	if err := a.Client.List(ctx, &siblings, client.InNamespace(s.Namespace), client.MatchingFields{index.SliceNode: node},
		client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing the slices of node %q in %s: %w", node, s.Namespace, err)
	}
	owners := map[string]*v1alpha1.ServiceWithHealthchecks{}
	for i := range siblings.Items {
		sib := &siblings.Items[i]
		if sib.UID == s.UID || !slicemeta.IsManaged(sib) || sib.DeletionTimestamp != nil {
			continue
		}
		owner, err := a.owner(ctx, sib.Namespace, slicemeta.ResourceOf(sib), owners)
		if err != nil {
			return err
		}
		if owner == nil || !slicemeta.IsOwnedBy(sib, owner.UID) {
			continue // The garbage collector's case, not the audit's.
		}
		in := a.input(sib, owner, pods)
		if len(Decide(in)) > 0 {
			continue
		}
		name := types.NamespacedName{Namespace: sib.Namespace, Name: sib.Name}
		a.confirm.forgetSlice(name)
		a.Verified.record(sib, in, true) // Found clean just above.
		a.clean.mark(name, version{uid: sib.UID, rv: sib.ResourceVersion}, epoch)
		a.Metrics.AuditedSlices.Inc()
	}
	return nil
}

// owner is the resource name of namespace ns from the cache, nil when it is gone; memo keeps
// each one read.
func (a *Auditor) owner(ctx context.Context, ns, name string, memo map[string]*v1alpha1.ServiceWithHealthchecks) (*v1alpha1.ServiceWithHealthchecks, error) {
	if swh, ok := memo[name]; ok {
		return swh, nil
	}
	swh := &v1alpha1.ServiceWithHealthchecks{}
	err := a.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, swh)
	switch {
	case apierrors.IsNotFound(err):
		swh = nil
	case err != nil:
		return nil, fmt.Errorf("reading resource %s/%s: %w", ns, name, err)
	}
	memo[name] = swh
	return swh, nil
}
