// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
)

// unlabelled selects this module's slices without the node key label: those written by agents
// of before the label (issue 19). Once every agent has run this version there are none, and
// the list each agent makes at start is empty.
func unlabelled() labels.Selector {
	managed, _ := labels.NewRequirement(discoveryv1.LabelManagedBy, selection.Equals, []string{slicemeta.ManagedBy})
	noKey, _ := labels.NewRequirement(slicemeta.LabelNodeKey, selection.DoesNotExist, nil)
	return labels.NewSelector().Add(*managed, *noKey)
}

// labelOwnSlices gives this node's slices that lack the node key label the label, retrying
// until it succeeds or ctx ends (an agent that cannot reach the API server cannot publish
// anyway). A slice that changed meanwhile is left to the publisher, which takes over a slice of
// its own that it finds in its way.
func labelOwnSlices(ctx context.Context, c client.Client, node string, log logr.Logger) error {
	var labelled int
	err := wait.ExponentialBackoffWithContext(ctx, wait.Backoff{Duration: time.Second, Factor: 2, Cap: 30 * time.Second, Steps: 1 << 30},
		func(ctx context.Context) (bool, error) {
			n, err := labelOnce(ctx, c, node)
			labelled += n
			if err != nil {
				log.Error(err, "labelling this node's slices with their node key; trying again")
				return false, nil
			}
			return true, nil
		})
	if err != nil {
		return fmt.Errorf("labelling this node's slices with their node key: %w", err)
	}
	if labelled > 0 {
		log.Info("labelled this node's slices with their node key", "slices", labelled)
	}
	return nil
}

// labelOnce lists the unlabelled slices page by page and labels this node's.
func labelOnce(ctx context.Context, c client.Client, node string) (int, error) {
	n := 0
	opts := []client.ListOption{client.MatchingLabelsSelector{Selector: unlabelled()}, client.Limit(500)}
	for {
		var list discoveryv1.EndpointSliceList
		if err := c.List(ctx, &list, opts...); err != nil {
			return n, fmt.Errorf("listing slices without a node key: %w", err)
		}
		for i := range list.Items {
			s := &list.Items[i]
			if slicemeta.NodeOf(s) != node {
				continue
			}
			s.Labels[slicemeta.LabelNodeKey] = slicemeta.NodeKey(node)
			switch err := c.Update(ctx, s); {
			case err == nil:
				n++
			case apierrors.IsNotFound(err), apierrors.IsConflict(err):
				// Gone, or changed: the publisher takes it over if it is still ours.
			default:
				return n, fmt.Errorf("labelling EndpointSlice %s/%s: %w", s.Namespace, s.Name, err)
			}
		}
		if list.Continue == "" {
			return n, nil
		}
		opts = append(opts[:2], client.Continue(list.Continue))
	}
}
