// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// Cache indexes of the agent's EndpointSlices.
const (
	// indexNamePrefix indexes a slice under every prefix of its name that ends with a dash, so
	// the slices whose names start with "<resource>-" are one index lookup.
	indexNamePrefix = "swh.namePrefix"
	// indexNode indexes this module's slices by the node they were published for.
	indexNode = "swh.node"
)

// namePrefixes are the index values of indexNamePrefix: "a-b-c" gives "a-" and "a-b-".
func namePrefixes(name string) []string {
	var out []string
	for i := range len(name) {
		if name[i] == '-' {
			out = append(out, name[:i+1])
		}
	}
	return out
}

// observe reads what one reconcile of res decides from: the resource, this agent's Node (its
// zone), the node's pods the resource selects, the slices the resource's names may hit, and the
// scheduler's results. Everything comes from the caches, the scheduler and memory: observe
// writes nothing.
func (r *Reconciler) observe(ctx context.Context, res types.NamespacedName) (Observed, error) {
	swh := &v1alpha1.ServiceWithHealthchecks{}
	if err := r.Client.Get(ctx, res, swh); err != nil {
		if apierrors.IsNotFound(err) {
			return Observed{}, errResourceGone
		}
		return Observed{}, fmt.Errorf("reading the resource: %w", err)
	}
	if swh.DeletionTimestamp != nil {
		return Observed{}, errResourceGone
	}
	node := &corev1.Node{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: r.Node}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return Observed{}, errNodeUnknown
		}
		return Observed{}, fmt.Errorf("reading Node %s: %w", r.Node, err)
	}

	// The pods and slices are the cache's own objects, not copies (UnsafeDisableDeepCopy): a
	// reconcile only reads them (Decide is pure; sliceplan.Merge copies a slice before changing
	// it and the publisher writes copies), and copying 1,000 pods and a 1,000-endpoint slice
	// per reconcile cost more than the rest of it (development/AGENT.md, "Writing").
	var pods []*corev1.Pod
	if sel := selector(swh); sel != nil {
		all, err := r.namespacePods(swh.Namespace)
		if err != nil {
			return Observed{}, fmt.Errorf("listing pods: %w", err)
		}
		for _, p := range all {
			if p.Spec.NodeName == r.Node && sel.Matches(labels.Set(p.Labels)) {
				pods = append(pods, p)
			}
		}
	}
	slices.SortFunc(pods, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })

	var sliceList discoveryv1.EndpointSliceList
	if err := r.Client.List(ctx, &sliceList, client.InNamespace(swh.Namespace),
		client.MatchingFields{indexNamePrefix: swh.Name + "-"}, client.UnsafeDisableDeepCopy); err != nil {
		return Observed{}, fmt.Errorf("listing EndpointSlices: %w", err)
	}
	existing := make([]*discoveryv1.EndpointSlice, 0, len(sliceList.Items))
	for i := range sliceList.Items {
		existing = append(existing, &sliceList.Items[i])
	}

	return Observed{
		Resource: swh,
		Node:     r.Node,
		Zone:     node.Labels[corev1.LabelTopologyZone],
		Pods:     pods,
		Slices:   existing,
		Results:  r.Scheduler.Results(res),
		Budget:   r.budgetOf(res),

		MaxEndpointsPerSlice: r.MaxEndpointsPerSlice,
		Now:                  time.Now(),
	}, nil
}

// namespacePods are the cached pods of a namespace (this node's: the cache holds no others): the
// informer's own objects, read from its namespace index. A List, even without deep copies,
// copies every Pod struct into the list: at 1,000 pods a megabyte and a half per reconcile for
// the garbage collector.
func (r *Reconciler) namespacePods(namespace string) ([]*corev1.Pod, error) {
	objs, err := r.podIndex.ByIndex(toolscache.NamespaceIndex, namespace)
	if err != nil {
		return nil, err
	}
	pods := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok {
			pods = append(pods, p)
		}
	}
	return pods, nil
}

// selects tells whether the resource selects the pod: same namespace and a non-empty selector
// that matches its labels.
func selects(swh *v1alpha1.ServiceWithHealthchecks, pod *corev1.Pod) bool {
	sel := selector(swh)
	return sel != nil && swh.Namespace == pod.Namespace && sel.Matches(labels.Set(pod.Labels))
}

// selector is the resource's pod selector, nil when it selects nothing (an empty selector).
// observe builds it once per reconcile, not once per pod.
func selector(swh *v1alpha1.ServiceWithHealthchecks) labels.Selector {
	if len(swh.Spec.Selector) == 0 {
		return nil
	}
	return labels.SelectorFromSet(swh.Spec.Selector)
}

// sliceIndexes are the cache indexes observe and the watches use.
var sliceIndexes = map[string]client.IndexerFunc{
	indexNamePrefix: func(o client.Object) []string { return namePrefixes(o.GetName()) },
	indexNode: func(o client.Object) []string {
		if n := slicemeta.NodeOf(o.(*discoveryv1.EndpointSlice)); n != "" {
			return []string{n}
		}
		return nil
	},
}
