// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"hash/maphash"
	"sync"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Verified holds, per slice, the endpoints its last audit found to be real Pods of the slice's
// node (every check of Decide passed), so that the status counts and lists only those
// (development/CONTROLLER.md, "Status"): a node that publishes endpoints naming Pods that do not
// exist, ready or not, cannot fill a resource's notReady list or its counts with them. An
// endpoint is held as a 64-bit hash of what it says of its Pod (name, UID, first address) under
// a seed of this process, so a forger cannot aim at a collision, and an entry costs a few tens
// of bytes whatever the names. It is safe for concurrent use; a nil *Verified verifies
// everything (the audit is off).
type Verified struct {
	seed maphash.Seed
	mu   sync.RWMutex
	m    map[types.NamespacedName]verifiedSlice
}

// verifiedSlice is one slice's record: the resourceVersion audited, its verified endpoints, and
// whether the audit found the slice clean (Decide found no endpoint failing).
type verifiedSlice struct {
	uid   types.UID
	rv    string
	ok    map[uint64]struct{}
	clean bool
}

// idOf is the hash of what endpoint e says of its Pod: name, UID and first address.
func (v *Verified) idOf(e *discoveryv1.Endpoint) (uint64, bool) {
	if e.TargetRef == nil || len(e.Addresses) == 0 {
		return 0, false
	}
	var h maphash.Hash
	h.SetSeed(v.seed)
	for _, part := range []string{e.TargetRef.Name, string(e.TargetRef.UID), e.Addresses[0]} {
		_, _ = h.WriteString(part)
		_ = h.WriteByte(0)
	}
	return h.Sum64(), true
}

// NewVerified returns an empty record.
func NewVerified() *Verified {
	return &Verified{seed: maphash.MakeSeed(), m: map[types.NamespacedName]verifiedSlice{}}
}

// record sets what the audit of slice s (input in) verified: each endpoint check passes; clean
// is whether Decide found the slice clean. On a stale node's slice (in.WholeSlice false) the
// audit does not judge the endpoints that route nothing, which are the controller's withdrawal
// of endpoints it had verified: such an endpoint verified at the slice's previous version stays
// verified, so the status keeps counting it (out of traffic) instead of losing it from its total.
func (v *Verified) record(s *discoveryv1.EndpointSlice, in Input, clean bool) {
	if v == nil {
		return
	}
	key := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
	v.mu.RLock()
	prev, hasPrev := v.m[key]
	v.mu.RUnlock()
	hasPrev = hasPrev && prev.uid == s.UID
	ok := make(map[uint64]struct{}, len(in.Endpoints))
	for i := range in.Endpoints {
		e := &in.Endpoints[i]
		id, has := v.idOf(e)
		if !has {
			continue
		}
		if check(in, e) == "" {
			ok[id] = struct{}{}
			continue
		}
		if _, before := prev.ok[id]; hasPrev && before && !in.WholeSlice && !Routes(e) {
			ok[id] = struct{}{}
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.m[key] = verifiedSlice{uid: s.UID, rv: s.ResourceVersion, ok: ok, clean: clean}
}

// Has tells whether the audit verified endpoint e of slice s at the slice's current version (a
// nil *Verified: every endpoint is).
func (v *Verified) Has(s *discoveryv1.EndpointSlice, e *discoveryv1.Endpoint) bool {
	if v == nil {
		return true
	}
	id, ok := v.idOf(e)
	if !ok {
		return false
	}
	v.mu.RLock()
	defer v.mu.RUnlock()
	rec, ok := v.m[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}]
	if !ok || rec.uid != s.UID || rec.rv != s.ResourceVersion {
		return false
	}
	_, yes := rec.ok[id]
	return yes
}

// Clean tells whether the audit found slice s clean at its current version (a nil *Verified:
// every slice is). A slice not judged yet at this version, or found forged, is not.
func (v *Verified) Clean(s *discoveryv1.EndpointSlice) bool {
	if v == nil {
		return true
	}
	v.mu.RLock()
	defer v.mu.RUnlock()
	rec, ok := v.m[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}]
	return ok && rec.uid == s.UID && rec.rv == s.ResourceVersion && rec.clean
}

func (v *Verified) forget(name types.NamespacedName) {
	if v == nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.m, name)
}

// Filter returns the slices with only their endpoints that the audit verified (copies where
// an endpoint is left out; the input is untouched), and pending true when a slice has a version
// the audit has not judged yet (the audit is on its way: the caller looks again shortly). An
// endpoint verified at an earlier version of its slice stays verified at a later one that says
// the same of it (a probe flipping its readiness is counted at once). With keepUnjudged a slice
// at a version not judged yet is kept whole (the caller has waited long enough: what the audit
// has not judged counts as before it, what it found false does not).
func (v *Verified) Filter(in []discoveryv1.EndpointSlice, keepUnjudged bool) (out []discoveryv1.EndpointSlice, pending bool) {
	if v == nil {
		return in, false
	}
	v.mu.RLock()
	defer v.mu.RUnlock()
	out = make([]discoveryv1.EndpointSlice, 0, len(in))
	for i := range in {
		s := &in[i]
		rec, ok := v.m[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}]
		if !ok || rec.uid != s.UID {
			rec = verifiedSlice{}
		}
		if rec.rv != s.ResourceVersion && len(s.Endpoints) > 0 {
			pending = true
			if keepUnjudged {
				out = append(out, *s)
				continue
			}
		}
		keep := make([]discoveryv1.Endpoint, 0, len(s.Endpoints))
		for j := range s.Endpoints {
			if id, has := v.idOf(&s.Endpoints[j]); has {
				if _, yes := rec.ok[id]; yes {
					keep = append(keep, s.Endpoints[j])
				}
			}
		}
		if len(keep) == len(s.Endpoints) {
			out = append(out, *s)
			continue
		}
		c := *s
		c.Endpoints = keep
		out = append(out, c)
	}
	return out, pending
}
