// Package publisher is the only code of the agent that writes EndpointSlices: it applies a
// slices.Plan. It writes nothing the plan does not ask for, retries a conflicting update on the
// latest version of the slice, and never writes a slice it does not own: a name held by
// anything else is reported with an Event on the resource.
package publisher

import (
	"context"
	"errors"
	"fmt"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/slices"
)

// Event reasons.
const (
	ReasonSliceNameTaken = "EndpointSliceNameTaken"
	ReasonWriteFailed    = "EndpointSliceWriteFailed"
)

// Publisher writes EndpointSlices.
type Publisher struct {
	// Client writes (and may read from a cache).
	Client client.Client
	// Reader reads straight from the API server (to look at a name held by a slice the cache
	// does not hold, and to retry a conflict on the latest version).
	Reader   client.Reader
	Recorder events.EventRecorder
	Metrics  *metrics.Metrics
}

// Apply carries out the plan for resource. Conflicts from the plan and names found taken while
// creating are reported with an Event and returned; other errors are returned joined, so the
// caller retries.
func (p *Publisher) Apply(ctx context.Context, owner *v1alpha1.ServiceWithHealthchecks, plan slices.Plan, keys map[string]slicemeta.SliceKey) ([]slices.Conflict, error) {
	conflicts := append([]slices.Conflict(nil), plan.Conflicts...)
	var errs []error
	for _, s := range plan.Create {
		err := p.Client.Create(ctx, s)
		if apierrors.IsAlreadyExists(err) {
			c, ownErr := p.heldBy(ctx, s, keys[s.Name])
			if ownErr != nil {
				errs = append(errs, ownErr)
				continue
			}
			if c != nil {
				conflicts = append(conflicts, *c)
				continue
			}
			// Ours, but the cache has not seen it yet: the next reconcile updates it.
			errs = append(errs, fmt.Errorf("creating EndpointSlice %s: exists and is ours, not in the cache yet", s.Name))
			continue
		}
		p.count(metrics.OpCreate, err)
		if err != nil {
			errs = append(errs, fmt.Errorf("creating EndpointSlice %s: %w", s.Name, err))
		}
	}
	for _, s := range plan.Update {
		if err := p.update(ctx, s, keys[s.Name]); err != nil {
			errs = append(errs, err)
		}
	}
	for _, s := range plan.Delete {
		uid, rv := s.UID, s.ResourceVersion
		err := p.Client.Delete(ctx, s, client.Preconditions{UID: &uid, ResourceVersion: &rv})
		if apierrors.IsNotFound(err) {
			continue
		}
		p.count(metrics.OpDelete, err)
		if err != nil {
			errs = append(errs, fmt.Errorf("deleting EndpointSlice %s: %w", s.Name, err))
		}
	}
	for _, c := range conflicts {
		p.Metrics.SliceConflicts.Inc()
		p.Recorder.Eventf(owner, nil, "Warning", ReasonSliceNameTaken, "Publish",
			"EndpointSlice %s is held by %s; this agent does not write it", c.Name, c.Holder)
	}
	return conflicts, errors.Join(errs...)
}

// update writes s; on a conflict it merges the desired content into the latest version of the
// slice, as long as that is still ours, and tries again.
func (p *Publisher) update(ctx context.Context, s *discoveryv1.EndpointSlice, key slicemeta.SliceKey) error {
	attempt := s
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		err := p.Client.Update(ctx, attempt)
		p.count(metrics.OpUpdate, err)
		if !apierrors.IsConflict(err) {
			return err
		}
		latest := &discoveryv1.EndpointSlice{}
		if gerr := p.Reader.Get(ctx, client.ObjectKeyFromObject(s), latest); gerr != nil {
			return fmt.Errorf("reading the latest version: %w", gerr)
		}
		if !slicemeta.IsManaged(latest) || !key.Matches(latest) {
			return fmt.Errorf("the slice is no longer ours (%s)", latest.Labels[slicemeta.LabelResource])
		}
		merged, changed := slices.Merge(latest, s)
		if !changed {
			attempt = nil
			return nil
		}
		attempt = merged
		return err
	})
	if err != nil {
		return fmt.Errorf("updating EndpointSlice %s: %w", s.Name, err)
	}
	return nil
}

// heldBy reads the slice that holds the name of s and says whether it is a conflict (nil when
// it is this resource's own slice).
func (p *Publisher) heldBy(ctx context.Context, s *discoveryv1.EndpointSlice, key slicemeta.SliceKey) (*slices.Conflict, error) {
	cur := &discoveryv1.EndpointSlice{}
	if err := p.Reader.Get(ctx, client.ObjectKeyFromObject(s), cur); err != nil {
		return nil, fmt.Errorf("reading EndpointSlice %s that holds the name: %w", s.Name, err)
	}
	if slicemeta.IsManaged(cur) && key.Matches(cur) {
		return nil, nil
	}
	c := slices.Conflicts(s.Name, cur)
	return &c, nil
}

func (p *Publisher) count(op string, err error) {
	if err != nil {
		p.Metrics.SliceWriteErrors.WithLabelValues(op).Inc()
		return
	}
	p.Metrics.SliceWrites.WithLabelValues(op).Inc()
}
