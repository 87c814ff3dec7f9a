// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/index"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/slicewrite"
	"github.com/deckhouse/service-with-healthchecks/lib/eventnote"
)

// A node's agent splits a group, the slices of one (resource, port, node, family, port number),
// into chunks and lists each endpoint in exactly one of them (images/agent sliceplan.assignChunks;
// development/CONTROLLER.md, "What no agent plan produces"): an endpoint is listed in two only
// for the moment of a move (a split creates the new chunk before it updates the old one, a merge
// updates chunk 0 before it deletes the others). A slice that repeats an endpoint another slice
// of its group lists, for longer than the confirmation window, is no agent's plan: a node that
// publishes one real endpoint in many slices, or spreads a few over many chunks, multiplies what
// every kube-proxy and the API server hold while every other check passes. Such a slice is
// redundant and removed; so with the empty slices removed too, a group never has more slices than
// endpoints.

// EventRedundant is the reason of the Event recorded when a redundant slice is deleted.
const EventRedundant = "RedundantEndpointSlice"

// ActionDeleteRedundant is the action of the Events of a redundant slice's deletion.
const ActionDeleteRedundant = "DeleteRedundantChunk"

// Repeat is an endpoint of a redundant slice that its group lists already.
type Repeat struct {
	// Address and Pod are the endpoint's first address and its targetRef's name.
	Address, Pod string
	// In is the slice that lists it before ("" when the slice lists it twice itself).
	In string
}

// Redundant is a slice of a group that repeats endpoints of its group.
type Redundant struct {
	Slice   *discoveryv1.EndpointSlice
	Repeats []Repeat
}

// groupKeyOf identifies the group of a slice: its resource and owner, port label, family and
// port numbers (the agent splits by the same, with one number per slice). The node is the
// caller's: it lists the node's slices only.
func groupKeyOf(s *discoveryv1.EndpointSlice) string {
	port, hasPort := slicemeta.PortOf(s)
	parts := []string{slicemeta.ResourceOf(s), string(slicemeta.OwnerUID(s)), strconv.FormatBool(hasPort), port, string(s.AddressType)}
	for _, p := range s.Ports {
		n := int32(0)
		if p.Port != nil {
			n = *p.Port
		}
		parts = append(parts, strconv.Itoa(int(n)))
	}
	return strings.Join(parts, "\x00")
}

// repeatKey identifies what an endpoint says of its Pod: name, UID and first address (an
// endpoint without a targetRef or an address fails Decide already).
func repeatKey(e *discoveryv1.Endpoint) (string, bool) {
	if e.TargetRef == nil || len(e.Addresses) == 0 {
		return "", false
	}
	return e.TargetRef.Name + "\x00" + string(e.TargetRef.UID) + "\x00" + e.Addresses[0], true
}

// JudgeGroup returns the redundant slices of one group. The slices are taken in the order an
// agent fills them, lowest chunk first (slicemeta.ChunkOf; then by name): a slice is redundant
// when it lists an endpoint twice, or an endpoint that a slice before it, itself not redundant,
// lists and the audit verified there (verified; an endpoint not verified yet keeps nothing,
// so a copy the audit has not judged, or found false, never makes another slice redundant).
// Which copy stays is so decided by the slices' names alone, the same whichever slice's audit
// judges the group: a split's or a merge's copy in the higher chunk goes, the one in the lower
// chunk serves on. It is pure.
func JudgeGroup(group []*discoveryv1.EndpointSlice, verified func(*discoveryv1.EndpointSlice, *discoveryv1.Endpoint) bool) []Redundant {
	ranked := slices.Clone(group)
	chunkOf := func(s *discoveryv1.EndpointSlice) int {
		port, _ := slicemeta.PortOf(s)
		return slicemeta.ChunkOf(s.Name, slicemeta.ResourceOf(s), port)
	}
	slices.SortFunc(ranked, func(a, b *discoveryv1.EndpointSlice) int {
		return cmp.Or(cmp.Compare(chunkOf(a), chunkOf(b)), cmp.Compare(a.Name, b.Name))
	})
	keptIn := map[string]string{}
	var out []Redundant
	for _, s := range ranked {
		var repeats []Repeat
		seen := make(map[string]bool, len(s.Endpoints))
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			k, ok := repeatKey(e)
			if !ok {
				continue
			}
			switch in, kept := keptIn[k]; {
			case seen[k]:
				repeats = append(repeats, Repeat{Address: e.Addresses[0], Pod: e.TargetRef.Name})
			case kept:
				repeats = append(repeats, Repeat{Address: e.Addresses[0], Pod: e.TargetRef.Name, In: in})
			}
			seen[k] = true
		}
		if len(repeats) > 0 {
			out = append(out, Redundant{Slice: s, Repeats: repeats})
			continue
		}
		for i := range s.Endpoints {
			if k, ok := repeatKey(&s.Endpoints[i]); ok && verified(s, &s.Endpoints[i]) {
				keptIn[k] = s.Name
			}
		}
	}
	return out
}

// redundantSince is when a slice (by UID) was first judged redundant.
type redundantSince struct {
	uid types.UID
	at  time.Time
}

// redundancy remembers, per slice, since when it has been redundant without a break: a slice
// is removed once that lasts the window, so an agent's move of an endpoint between chunks,
// which lists it twice for a moment, is never taken for redundancy. It holds an entry only for
// a slice judged redundant at its last judgement, dropped when the slice is judged otherwise or
// deleted.
type redundancy struct {
	mu     sync.Mutex
	window time.Duration
	since  map[types.NamespacedName]redundantSince
}

func newRedundancy(window time.Duration) *redundancy {
	return &redundancy{window: window, since: map[types.NamespacedName]redundantSince{}}
}

// observe records the judgement at now of a group (its slices' names, and those found
// redundant): it returns the redundant ones whose window has passed, and how long until the
// next one's does (0: none waits).
func (r *redundancy) observe(group []types.NamespacedName, found []Redundant, now time.Time) (due []Redundant, wait time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	redundant := make(map[types.NamespacedName]bool, len(found))
	for _, red := range found {
		name := types.NamespacedName{Namespace: red.Slice.Namespace, Name: red.Slice.Name}
		redundant[name] = true
		since, ok := r.since[name]
		if !ok || since.uid != red.Slice.UID {
			since = redundantSince{uid: red.Slice.UID, at: now}
			r.since[name] = since
		}
		left := since.at.Add(r.window).Sub(now)
		if left <= 0 {
			due = append(due, red)
		} else if wait == 0 || left < wait {
			wait = left
		}
	}
	for _, name := range group {
		if !redundant[name] {
			delete(r.since, name)
		}
	}
	return due, wait
}

func (r *redundancy) forget(name types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.since, name)
}

// size is how many slices wait (tests).
func (r *redundancy) size() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.since)
}

// judgeGroup judges the group of slice s (which its audit found clean) among its node's slices
// in the cache, deletes those redundant for the window, and returns how long until the next
// one's window ends (0: none waits). Any slice of the group may be the one deleted: the one
// written last can be the lower chunk.
func (a *Auditor) judgeGroup(ctx context.Context, s *discoveryv1.EndpointSlice) (time.Duration, error) {
	group, names, err := a.groupOf(ctx, s)
	if err != nil {
		return 0, err
	}
	found := JudgeGroup(group, a.Verified.Has)
	due, wait := a.redundant.observe(names, found, a.Now())
	for _, red := range due {
		if err := a.deleteRedundant(ctx, red); err != nil {
			return 0, err
		}
	}
	return wait, nil
}

// groupOf lists, from the cache, the slices of s's group on its node (s included), owned like
// s, and the names of all of them. Of the others, only those the audit found clean at their
// current version are returned as slices (Verified.Clean): a slice not judged yet at its version
// is judged by its own audit, which judges the group again, and a forged one is the forgery's to
// remove, with its Events and the node's memory (a forged slice repeating a real endpoint of a
// lower chunk was deleted as redundant when its group's window ended first, and never reported
// as forged); neither keeps an endpoint for another slice. s itself is the caller's: found clean,
// or its latest version after a conflict.
func (a *Auditor) groupOf(ctx context.Context, s *discoveryv1.EndpointSlice) ([]*discoveryv1.EndpointSlice, []types.NamespacedName, error) {
	var list discoveryv1.EndpointSliceList
	if err := a.Client.List(ctx, &list, client.InNamespace(s.Namespace), client.MatchingFields{index.SliceNode: slicemeta.NodeOf(s)},
		client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("listing the slices of node %q in %s: %w", slicemeta.NodeOf(s), s.Namespace, err)
	}
	key := groupKeyOf(s)
	group := []*discoveryv1.EndpointSlice{s}
	names := []types.NamespacedName{{Namespace: s.Namespace, Name: s.Name}}
	for i := range list.Items {
		o := &list.Items[i]
		if o.Name == s.Name || !slicemeta.IsManaged(o) || o.DeletionTimestamp != nil || groupKeyOf(o) != key {
			continue
		}
		names = append(names, types.NamespacedName{Namespace: o.Namespace, Name: o.Name})
		if a.Verified.Clean(o) {
			group = append(group, o)
		}
	}
	return group, names, nil
}

// deleteRedundant deletes a redundant slice as judged (UID and resourceVersion), then records
// the Events and counts (slicewrite). A delete that conflicts (the slice was rewritten since the
// cache's version) reads the latest version and judges its group again with it: still redundant
// (the same object), it is deleted whatever its resourceVersion, so no rewrite outruns the
// delete; otherwise it is left to its next audit.
func (a *Auditor) deleteRedundant(ctx context.Context, red Redundant) error {
	s := red.Slice.DeepCopy() // From the cache, uncopied.
	deleted, err := a.Deleter.DeleteRedundant(ctx, s, slicewrite.SameVersion)
	if err != nil || deleted {
		if deleted {
			a.reportRedundant(ctx, s, red.Repeats)
		}
		return err
	}
	var latest discoveryv1.EndpointSlice
	switch err := a.API.Get(ctx, client.ObjectKeyFromObject(s), &latest); {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("reading EndpointSlice %s/%s again after a conflict: %w", s.Namespace, s.Name, err)
	}
	if latest.UID != s.UID || latest.DeletionTimestamp != nil || slicemeta.NodeOf(&latest) != slicemeta.NodeOf(s) || groupKeyOf(&latest) != groupKeyOf(s) {
		return nil
	}
	group, _, err := a.groupOf(ctx, &latest)
	if err != nil {
		return err
	}
	for _, again := range JudgeGroup(group, a.Verified.Has) {
		if again.Slice.Name != latest.Name {
			continue
		}
		if deleted, err = a.Deleter.DeleteRedundant(ctx, &latest, slicewrite.SameObject); deleted {
			a.reportRedundant(ctx, &latest, again.Repeats)
		}
		return err
	}
	return nil
}

// reportRedundant records the Events of a deleted redundant slice and logs it: on the resource
// (related: the slice) and on the Node, naming the node and the repeated endpoints with the
// slice that lists each before. Notes are capped (eventnote).
func (a *Auditor) reportRedundant(ctx context.Context, s *discoveryv1.EndpointSlice, repeats []Repeat) {
	node := slicemeta.NodeOf(s)
	parts := make([]string, 0, len(repeats))
	for _, r := range repeats {
		where := "twice in this slice"
		if r.In != "" {
			where = "also in EndpointSlice " + r.In
		}
		parts = append(parts, fmt.Sprintf("endpoint %s (pod %q) %s", r.Address, r.Pod, where))
	}
	var regarding runtime.Object = s
	if ref, ok := slicemeta.ResourceRef(s.OwnerReferences); ok {
		regarding = &v1alpha1.ServiceWithHealthchecks{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: ref.Name, UID: ref.UID}}
	}
	why := " (an agent lists each endpoint in one slice of its port, node and family): "
	a.Recorder.Eventf(regarding, s, corev1.EventTypeWarning, EventRedundant, ActionDeleteRedundant, "%s",
		eventnote.Join(fmt.Sprintf("Deleted EndpointSlice %s published for node %q, which repeats endpoints of its other slices%s", s.Name, node, why),
			parts, "; ", MaxNote))
	a.Recorder.Eventf(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, s, corev1.EventTypeWarning, EventRedundant, ActionDeleteRedundant, "%s",
		eventnote.Join(fmt.Sprintf("Node %s published EndpointSlice %s/%s repeating endpoints of its other slices, deleted%s", node, s.Namespace, s.Name, why),
			parts, "; ", MaxNote))
	ctrl.LoggerFrom(ctx).Info("deleted a redundant EndpointSlice", "slice", s.Name, "node", node,
		"endpoints", parts[:min(len(parts), 20)], "repeatedEndpoints", len(parts))
}
