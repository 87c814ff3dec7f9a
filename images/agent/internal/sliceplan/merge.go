// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package sliceplan

import (
	"maps"
	"reflect"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/deckhouse/service-with-healthchecks/api/notready"
	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// Merge returns a copy of cur with the content of want, and whether anything differs.
// Labels and annotations of others are kept; ours are set.
//
// The note of why endpoints are out (notready.Annotation) is written with the content, never
// alone: whether anything differs is decided without it, so a reason whose text changes while
// the verdict stays (a timeout that becomes a refused connection) writes nothing. When the
// slice is written for another difference, the note is want's (removed when want has none).
// The trigger time (TriggerAnnotation) is likewise never a difference: StampTriggers sets it on
// every write, and a retry on a newer version carries want's.
func Merge(cur, want *discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, bool) {
	// Compare before copying: in steady state nothing differs and nothing is allocated.
	if !differs(cur, want) {
		return cur, false
	}
	// The endpoints are replaced: copy everything but them (a 1,000-endpoint slice's copy
	// would be most of a reconcile's allocations).
	shallow := *cur
	shallow.Endpoints = nil
	u := shallow.DeepCopy()
	if u.Labels == nil {
		u.Labels = map[string]string{}
	}
	maps.Copy(u.Labels, want.Labels)
	if _, ok := want.Labels[wellknown.LabelNode]; !ok {
		delete(u.Labels, wellknown.LabelNode)
	}
	if u.Annotations == nil {
		u.Annotations = map[string]string{}
	}
	maps.Copy(u.Annotations, want.Annotations)
	if _, ok := want.Annotations[notready.Annotation]; !ok {
		delete(u.Annotations, notready.Annotation)
	}
	if refs, changed := ownerRefs(u.OwnerReferences, want.OwnerReferences[0]); changed {
		u.OwnerReferences = refs
	}
	u.Endpoints, u.Ports = want.Endpoints, want.Ports
	return u, true
}

// differs tells whether Merge would change anything in cur.
func differs(cur, want *discoveryv1.EndpointSlice) bool {
	for k, v := range want.Labels {
		if old, ok := cur.Labels[k]; !ok || old != v {
			return true
		}
	}
	if _, ok := want.Labels[wellknown.LabelNode]; !ok {
		if _, had := cur.Labels[wellknown.LabelNode]; had {
			return true
		}
	}
	for k, v := range want.Annotations {
		if k == notready.Annotation || k == TriggerAnnotation {
			continue
		}
		if old, ok := cur.Annotations[k]; !ok || old != v {
			return true
		}
	}
	if ownerRefsDiffer(cur.OwnerReferences, want.OwnerReferences[0]) {
		return true
	}
	return !sameEndpoints(cur.Endpoints, want.Endpoints) || !reflect.DeepEqual(cur.Ports, want.Ports)
}

// sameEndpoints compares endpoint lists field by field: reflect.DeepEqual allocates for every
// pointer it follows, and this runs for every endpoint of every reconcile. Fields the agent never
// sets (hints, deprecated topology) are compared with reflect only when either side has them.
func sameEndpoints(a, b []discoveryv1.Endpoint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := &a[i], &b[i]
		if !slices.Equal(x.Addresses, y.Addresses) ||
			!ptr.Equal(x.Conditions.Ready, y.Conditions.Ready) ||
			!ptr.Equal(x.Conditions.Serving, y.Conditions.Serving) ||
			!ptr.Equal(x.Conditions.Terminating, y.Conditions.Terminating) ||
			!ptr.Equal(x.Hostname, y.Hostname) || !ptr.Equal(x.NodeName, y.NodeName) || !ptr.Equal(x.Zone, y.Zone) ||
			!sameTargetRef(x.TargetRef, y.TargetRef) {
			return false
		}
		if (x.Hints != nil || y.Hints != nil || len(x.DeprecatedTopology) > 0 || len(y.DeprecatedTopology) > 0) &&
			(!reflect.DeepEqual(x.Hints, y.Hints) || !reflect.DeepEqual(x.DeprecatedTopology, y.DeprecatedTopology)) {
			return false
		}
	}
	return true
}

func sameTargetRef(a, b *corev1.ObjectReference) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// sameRef compares two owner references field by field (without reflection: it runs for every
// slice of every reconcile).
func sameRef(a, b metav1.OwnerReference) bool {
	return a.APIVersion == b.APIVersion && a.Kind == b.Kind && a.Name == b.Name && a.UID == b.UID &&
		ptr.Equal(a.Controller, b.Controller) && ptr.Equal(a.BlockOwnerDeletion, b.BlockOwnerDeletion)
}

// ownerRefsDiffer tells whether ownerRefs would change refs: ref is missing, or there is
// another ServiceWithHealthchecks reference besides it.
func ownerRefsDiffer(refs []metav1.OwnerReference, ref metav1.OwnerReference) bool {
	found := 0
	ours := 0
	for _, r := range refs {
		if slicemeta.IsResourceRef(r) {
			ours++
			if sameRef(r, ref) {
				found++
			}
		}
	}
	return found != 1 || ours != 1
}

// ownerRefs replaces any ServiceWithHealthchecks owner reference with ref and keeps the others.
func ownerRefs(refs []metav1.OwnerReference, ref metav1.OwnerReference) ([]metav1.OwnerReference, bool) {
	out := []metav1.OwnerReference{ref}
	found := false
	for _, r := range refs {
		if slicemeta.IsResourceRef(r) {
			if sameRef(r, ref) {
				found = true
			}
			continue
		}
		out = append(out, r)
	}
	changed := !found || len(out) != len(refs)
	return out, changed
}
