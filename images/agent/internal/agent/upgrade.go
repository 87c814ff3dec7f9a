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
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/publisher"
)

// unlabelled selects this module's slices without the node key label: those written by agents
// of before the label (issue 19). Once every agent has run this version there are none, and
// the list each agent makes at start is empty.
func unlabelled() labels.Selector {
	managed, _ := labels.NewRequirement(discoveryv1.LabelManagedBy, selection.Equals, []string{wellknown.ManagedBy})
	noKey, _ := labels.NewRequirement(wellknown.LabelNodeKey, selection.DoesNotExist, nil)
	return labels.NewSelector().Add(*managed, *noKey)
}

// labelOwnSlices gives this node's slices that lack the node key label the label, retrying
// until it succeeds or ctx ends (an agent that cannot reach the API server cannot publish
// anyway). A slice that changed meanwhile is left to the publisher, which takes over a slice of
// its own that it finds in its way. A slice the API server refuses to change (Forbidden or
// Invalid: the slice policy refuses what no honest agent writes, e.g. a legacy slice for
// default/kubernetes) is skipped with a log line: retrying cannot change the answer, and it must
// not keep the agent from starting.
func labelOwnSlices(ctx context.Context, p *publisher.Publisher, node string, log logr.Logger) error {
	var labelled int
	err := wait.ExponentialBackoffWithContext(ctx, wait.Backoff{Duration: time.Second, Factor: 2, Cap: 30 * time.Second, Steps: 1 << 30},
		func(ctx context.Context) (bool, error) {
			n, err := labelOnce(ctx, p, node, log)
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

// labelOnce lists the unlabelled slices page by page, straight from the API server (the cache
// holds only labelled ones), and has the publisher label this node's; it skips a slice whose
// change the API server refuses (Forbidden, Invalid).
func labelOnce(ctx context.Context, p *publisher.Publisher, node string, log logr.Logger) (int, error) {
	n := 0
	opts := []client.ListOption{client.MatchingLabelsSelector{Selector: unlabelled()}, client.Limit(500)}
	for {
		var list discoveryv1.EndpointSliceList
		if err := p.Reader.List(ctx, &list, opts...); err != nil {
			return n, fmt.Errorf("listing slices without a node key: %w", err)
		}
		for i := range list.Items {
			s := &list.Items[i]
			if slicemeta.NodeOf(s) != node {
				continue
			}
			wrote, err := p.LabelNodeKey(ctx, s, node)
			if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
				log.Info("the API server refuses to label this slice with its node key; skipping it",
					"slice", client.ObjectKeyFromObject(s).String(), "reason", err.Error())
				continue
			}
			if err != nil {
				return n, err
			}
			if wrote {
				n++
			}
		}
		if list.Continue == "" {
			return n, nil
		}
		opts = append(opts[:2], client.Continue(list.Continue))
	}
}
