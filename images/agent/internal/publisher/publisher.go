// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package publisher is the only code of the agent that writes EndpointSlices: it carries out a
// sliceplan.Plan, and labels with their node key the slices an agent of before that label
// published (LabelNodeKey, at start). Every write is counted here. It writes nothing the plan does not ask for, retries a conflicting update on
// the latest version of the slice, and never writes a slice it does not own. It records no
// Events: it reports what it wrote and what it refused, and the reconciler records from that.
package publisher

import (
	"context"
	"errors"
	"fmt"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/sliceplan"
)

// Publisher writes EndpointSlices.
type Publisher struct {
	// Client writes (and may read from a cache).
	Client client.Client
	// Reader reads straight from the API server (to look at a name held by a slice the cache
	// does not hold, and to retry a conflict on the latest version).
	Reader  client.Reader
	Metrics *metrics.Metrics
}

// Result is what Apply did.
type Result struct {
	// Written holds, by name, every slice created or updated, as the API server returned it.
	Written map[string]*discoveryv1.EndpointSlice
	// Conflicts are the plan's conflicts and the names found held by someone else on create:
	// those slices were not written.
	Conflicts []sliceplan.Conflict
}

// Apply carries out the plan. Failed writes are returned joined, so the caller retries; what
// was written before a failure is in the Result all the same.
func (p *Publisher) Apply(ctx context.Context, plan sliceplan.Plan) (Result, error) {
	res := Result{Written: map[string]*discoveryv1.EndpointSlice{}, Conflicts: append([]sliceplan.Conflict(nil), plan.Conflicts...)}
	var errs []error
	// writeFailed defers the plan's deletes: a slice the plan deletes may be the one a failed
	// create or update replaces (a slice renamed, as the IPv6 slices were by issue 20, a split
	// port's new primary, or the chunks a shrunk group merges into its first: sliceplan
	// assignChunks), and deleting it first would take its endpoints out of the Service until the
	// retry. The retry, planned from the cache again, deletes what is still not desired.
	writeFailed := false
	for _, s := range plan.Create {
		created := s.DeepCopy()
		err := p.Client.Create(ctx, created)
		if apierrors.IsAlreadyExists(err) {
			cur, c, ownErr := p.heldBy(ctx, s, plan.Keys[s.Name])
			if ownErr != nil {
				errs = append(errs, ownErr)
				writeFailed = true
				continue
			}
			if c != nil {
				res.Conflicts = append(res.Conflicts, *c)
				continue
			}
			// Ours, but not in the cache: a slice an earlier agent wrote before it labelled
			// slices with their node key (the cache holds only labelled ones), or one the cache
			// has not seen yet. Take it over with one update of the latest version.
			merged, changed := sliceplan.Merge(cur, s)
			if !changed {
				continue
			}
			written, uerr := p.update(ctx, merged, plan.Keys[s.Name])
			if uerr != nil {
				errs = append(errs, uerr)
				writeFailed = true
				continue
			}
			if written != nil {
				res.Written[s.Name] = written
			}
			continue
		}
		p.count(metrics.OpCreate, err)
		if err != nil {
			errs = append(errs, fmt.Errorf("creating EndpointSlice %s: %w", s.Name, err))
			writeFailed = true
			continue
		}
		res.Written[s.Name] = created
	}
	for _, s := range plan.Update {
		written, err := p.update(ctx, s, plan.Keys[s.Name])
		if err != nil {
			errs = append(errs, err)
			writeFailed = true
			continue
		}
		if written != nil {
			res.Written[s.Name] = written
		}
	}
	if writeFailed && len(plan.Delete) > 0 {
		errs = append(errs, fmt.Errorf("deleting %d EndpointSlice(s) waits for the retry of the failed write", len(plan.Delete)))
		return res, errors.Join(errs...)
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
	return res, errors.Join(errs...)
}

// LabelNodeKey gives s, a slice of this module on node that lacks the node key label, the label
// (issue 19: an agent upgraded from a version that did not write it). It reports whether it
// wrote: a slice gone or changed meanwhile is not written (the caller leaves it to Apply, which
// takes over a slice of its own that it finds in its way).
func (p *Publisher) LabelNodeKey(ctx context.Context, s *discoveryv1.EndpointSlice, node string) (bool, error) {
	labelled := s.DeepCopy()
	if labelled.Labels == nil {
		labelled.Labels = map[string]string{}
	}
	labelled.Labels[wellknown.LabelNodeKey] = slicemeta.NodeKey(node)
	labelled.ManagedFields = StripManagedFields()
	err := p.Client.Update(ctx, labelled)
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return false, nil
	}
	p.count(metrics.OpUpdate, err)
	if err != nil {
		return false, fmt.Errorf("labelling EndpointSlice %s/%s: %w", s.Namespace, s.Name, err)
	}
	return true, nil
}

// StripManagedFields is the managedFields value every update sends: a list of one empty entry,
// which tells the API server to remove the slice's managedFields (Kubernetes "Server-Side Apply",
// "Clearing managedFields"). An update of an object without managedFields, by a client that
// does not apply, is not tracked at all (the field manager's skipNonAppliedManager), which spares
// the API server its structured-merge walk of every endpoint, twice, on each update: at 1,000
// endpoints the update costs about 40 % less (development/AGENT.md, "Writing"). The slices are
// this module's alone and written with updates; who manages one is in its managed-by label.
func StripManagedFields() []metav1.ManagedFieldsEntry { return []metav1.ManagedFieldsEntry{{}} }

// update writes s; on a conflict it merges the desired content into the latest version of the
// slice, as long as that is still ours, and tries again. It returns the slice as written, or
// nil when the latest version already had the desired content.
func (p *Publisher) update(ctx context.Context, s *discoveryv1.EndpointSlice, key slicemeta.SliceKey) (*discoveryv1.EndpointSlice, error) {
	attempt := s.DeepCopy()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		attempt.ManagedFields = StripManagedFields()
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
			return fmt.Errorf("the slice is no longer ours (%s)", slicemeta.ResourceOf(latest))
		}
		merged, changed := sliceplan.Merge(latest, s)
		if !changed {
			attempt = nil
			return nil
		}
		attempt = merged
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("updating EndpointSlice %s: %w", s.Name, err)
	}
	return attempt, nil
}

// heldBy reads the slice that holds the name of s and says whether it is a conflict (nil when
// it is this resource's own slice, which it returns).
func (p *Publisher) heldBy(ctx context.Context, s *discoveryv1.EndpointSlice, key slicemeta.SliceKey) (*discoveryv1.EndpointSlice, *sliceplan.Conflict, error) {
	cur := &discoveryv1.EndpointSlice{}
	if err := p.Reader.Get(ctx, client.ObjectKeyFromObject(s), cur); err != nil {
		return nil, nil, fmt.Errorf("reading EndpointSlice %s that holds the name: %w", s.Name, err)
	}
	if slicemeta.IsManaged(cur) && key.Matches(cur) {
		return cur, nil, nil
	}
	c := sliceplan.ConflictOf(s.Name, cur)
	return nil, &c, nil
}

func (p *Publisher) count(op string, err error) {
	if err != nil {
		p.Metrics.SliceWriteErrors.WithLabelValues(op).Inc()
		return
	}
	p.Metrics.SliceWrites.WithLabelValues(op).Inc()
}
