// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package liveness

// Observe: what the runner and the withdrawer read from the API server (Leases, uncached) and
// the cache (Nodes, our slices by node, resources), handed to the pure deciders.

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/index"
)

// observe lists the agents' Leases and the Nodes and feeds the tracker; nodes whose Lease is
// gone, or whose Node is, are forgotten (their stale-node series go with them).
func (r *Runner) observe(ctx context.Context, period time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, max(2*period, 5*time.Second))
	defer cancel()
	var leases coordinationv1.LeaseList
	if err := r.Leases.List(ctx, &leases, client.InNamespace(r.Namespace)); err != nil {
		return fmt.Errorf("listing Leases in %s: %w", r.Namespace, err)
	}
	var nodeList metav1.PartialObjectMetadataList
	nodeList.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	// The cache's own objects (no copy), only read: a list of every Node on each observation.
	if err := r.Nodes.List(ctx, &nodeList, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing Nodes: %w", err)
	}
	nodes := sets.New[string]()
	for i := range nodeList.Items {
		nodes.Insert(nodeList.Items[i].Name)
	}
	renewals, orphans := AgentRenewals(leases.Items, nodes)
	if r.Budgets != nil {
		r.Budgets(ctx, BudgetNotes(leases.Items, nodes))
	}
	seen := make(map[string]bool, len(renewals))
	for node, renew := range renewals {
		seen[node] = true
		r.Withdrawer.Tracker.Observe(node, renew)
	}
	for node := range r.known {
		if !seen[node] {
			r.Withdrawer.Tracker.Forget(node)
		}
	}
	r.known = seen
	now := make(map[string]bool, len(orphans))
	for _, node := range orphans {
		now[node] = true
		if !r.orphans[node] {
			r.Log.Info("ignoring the Lease of a node that does not exist (the garbage collector removes it with its Node)",
				"namespace", r.Namespace, "lease", wellknown.AgentLeaseName(node), "node", node)
		}
	}
	r.orphans = now
	return nil
}

// AgentRenewals is the pure reading of the Leases in the lease namespace: the renewTime of
// every agent's Lease, by node, for the nodes that exist; and, sorted, the nodes of agents'
// Leases whose Node does not exist (ignored: their agents are gone with their nodes, and counting
// them would hold the guard forever once they outnumber the live agents). Other Leases are
// skipped (agentLease).
func AgentRenewals(leases []coordinationv1.Lease, nodes sets.Set[string]) (renewals map[string]time.Time, orphans []string) {
	renewals = make(map[string]time.Time, len(leases))
	for i := range leases {
		node, renew, ok := agentLease(&leases[i])
		if !ok {
			continue
		}
		if !nodes.Has(node) {
			orphans = append(orphans, node)
			continue
		}
		renewals[node] = renew
	}
	sort.Strings(orphans)
	return renewals, orphans
}

// agentLease reads the node and renewTime of an agent's Lease; ok is false for other Leases and
// for one not yet renewed.
func agentLease(l *coordinationv1.Lease) (node string, renew time.Time, ok bool) {
	if !strings.HasPrefix(l.Name, wellknown.AgentLeasePrefix) || l.Spec.RenewTime == nil {
		return "", time.Time{}, false
	}
	node = l.Annotations[wellknown.AnnotationNode]
	if node == "" && l.Spec.HolderIdentity != nil {
		node = *l.Spec.HolderIdentity
	}
	if node == "" || wellknown.AgentLeaseName(node) != l.Name {
		return "", time.Time{}, false
	}
	return node, l.Spec.RenewTime.Time, true
}

// observeSlices reads, through the cache's index by node, the slices of the stale nodes, and the live
// resources they name by name, and asks Plan. The cost grows with the slices of those nodes,
// not with every slice and resource of the cluster: the runner calls it on every observation
// while a node stays stale.
func (w *Withdrawer) observeSlices(ctx context.Context, nodes []string, at time.Time) ([]*discoveryv1.EndpointSlice, error) {
	var all []discoveryv1.EndpointSlice
	for _, n := range nodes {
		var list discoveryv1.EndpointSliceList
		// The cache's own objects, not copies: Plan copies what it changes.
		if err := w.Client.List(ctx, &list, client.MatchingFields{index.SliceNode: n}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("listing our EndpointSlices of node %s: %w", n, err)
		}
		all = append(all, list.Items...)
	}
	owners := map[types.NamespacedName]types.UID{}
	for i := range all {
		key := types.NamespacedName{Namespace: all[i].Namespace, Name: all[i].Labels[wellknown.LabelResource]}
		if _, seen := owners[key]; seen || key.Name == "" {
			continue
		}
		var swh v1alpha1.ServiceWithHealthchecks
		err := w.Client.Get(ctx, key, &swh)
		switch {
		case apierrors.IsNotFound(err):
			owners[key] = "" // no live resource: none of its slices is ours to withdraw
		case err != nil:
			return nil, fmt.Errorf("reading ServiceWithHealthchecks %s: %w", key, err)
		default:
			owners[key] = swh.UID
		}
	}
	return Plan(all, owners, nodes, at), nil
}
