// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// DefaultWindow is how long a mismatch must persist before a slice is taken for a forgery: a
// few agent coalescing windows (200 ms) plus the agent's write, so that an honest agent whose
// Pod changed IP or node since it wrote has republished before the audit decides.
const DefaultWindow = 1500 * time.Millisecond

// sliceWindows is how many windows a slice may stay forged, by any endpoint, before it is
// deleted even though no single endpoint lasted a window (a forger rotating addresses).
const sliceWindows = 3

// Bounds of what the audit remembers of forgeries (development/CONTROLLER.md, "Forgery is a
// property of the node").
const (
	// PendingTTL is how long a forged endpoint whose window runs is remembered after it was
	// last seen: a forger that deletes its slice and writes the same endpoint again under
	// another name within it keeps its window running, so rotation is confirmed.
	PendingTTL = time.Minute
	// KnownTTL is how long a confirmed forgery is remembered after it was last repeated: a
	// slice of that node that repeats it is deleted at once, without a new window.
	KnownTTL = time.Hour
	// MaxPendingPerNode bounds the forged endpoints whose window runs per node. An honest node
	// has at most a few per Pod at once (its pods' addresses): a node past it floods, and its
	// further forged endpoints are confirmed at once.
	MaxPendingPerNode = 1024
	// MaxKnownPerNode bounds the confirmed forgeries remembered per node (the least recently
	// repeated one is forgotten first).
	MaxKnownPerNode = 1024
	// MaxNodes bounds the nodes with a forgery remembered (the one whose last sighting is the
	// oldest is forgotten first).
	MaxNodes = 10000
)

// pending is a forged endpoint whose window runs: first and last seen.
type pending struct{ first, last time.Time }

// nodeState is what is remembered of one node's forgeries.
type nodeState struct {
	// pending are forged endpoints (fullKey) not confirmed yet, whichever slice showed them.
	pending map[string]*pending
	// known are confirmed forgeries (knownKey) with when they were last repeated.
	known map[string]time.Time
	// last is the last time anything of this node was recorded.
	last time.Time
}

// verdict is the confirmer's answer for one audit of a forged slice.
type verdict struct {
	// confirmed are the forged endpoints to act on now; repeated are those among them that
	// repeat a forgery confirmed earlier for the node (fresh: confirmed by this audit).
	confirmed, repeated []Forged
	// wait, when nothing is confirmed, is how long until something may be.
	wait time.Duration
}

// confirmer remembers forgeries per node and per forged endpoint (namespace, address, Pod and
// UID), on an injected clock, not per slice: the window of an endpoint runs whichever slice of
// the node shows it, so deleting a forged slice and writing it again under another name does
// not restart it, and a confirmed forgery is remembered so that a slice repeating it is
// deleted at once. A slice forged continuously (by any endpoint) for sliceWindows windows is
// confirmed too (addresses rotated within one slice).
type confirmer struct {
	mu        sync.Mutex
	window    time.Duration
	nodes     map[string]*nodeState
	slice     map[types.UID]time.Time            // slice UID → forged continuously since
	names     map[types.NamespacedName]types.UID // slice name → UID, to forget deleted slices
	lastSweep time.Time
	// onKnown is called, under the lock, with a node whose count of remembered (confirmed)
	// forgeries changed, 0 when it is forgotten (for the metric); may be nil.
	onKnown func(node string, known int)
}

func newConfirmer(window time.Duration) *confirmer {
	return &confirmer{window: window, nodes: map[string]*nodeState{}, slice: map[types.UID]time.Time{}, names: map[types.NamespacedName]types.UID{}}
}

// fullKey identifies a forged endpoint: what it says, whichever slice says it.
func fullKey(ns string, f Forged) string {
	return ns + "|" + f.Address + "|" + f.Pod + "|" + f.UID
}

// knownKey identifies a confirmed forgery: the address it sent traffic to (whatever Pod the
// forger names next), or, for one without an address, the whole endpoint and its reason.
func knownKey(ns string, f Forged) string {
	if f.Address != "" {
		return ns + "|" + f.Address
	}
	return fullKey(ns, f) + "|" + f.Reason
}

// observe records the audit at now of slice name (UID uid) of node in namespace ns: forged are
// its endpoints that fail, clean the fullKeys of those that pass (a forged endpoint seen clean
// is no longer pending: an honest Pod relabelled out and back starts again). It returns what to
// act on.
func (c *confirmer) observe(name types.NamespacedName, uid types.UID, node, ns string, forged []Forged, clean []string, now time.Time) verdict {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweepLocked(now)
	if prev, ok := c.names[name]; ok && prev != uid {
		c.forgetSliceLocked(name)
	}
	st := c.nodes[node]
	if st != nil {
		for _, k := range clean {
			delete(st.pending, k)
		}
	}
	if len(forged) == 0 {
		c.forgetSliceLocked(name)
		return verdict{}
	}
	if st == nil {
		st = c.newNodeLocked(node)
	}
	st.last = now
	c.names[name] = uid
	sliceSince, ok := c.slice[uid]
	if !ok {
		sliceSince = now
		c.slice[uid] = now
	}
	var v verdict
	wait := sliceSince.Add(sliceWindows * c.window).Sub(now)
	for _, f := range forged {
		kk := knownKey(ns, f)
		if _, ok := st.known[kk]; ok {
			st.known[kk] = now
			v.confirmed = append(v.confirmed, f)
			v.repeated = append(v.repeated, f)
			continue
		}
		fk := fullKey(ns, f)
		p := st.pending[fk]
		if p == nil {
			if len(st.pending) >= MaxPendingPerNode {
				v.confirmed = append(v.confirmed, f) // A flood: no honest node has so many.
				continue
			}
			p = &pending{first: now}
			st.pending[fk] = p
		}
		p.last = now
		left := p.first.Add(c.window).Sub(now)
		if left <= 0 || wait <= 0 {
			v.confirmed = append(v.confirmed, f)
		} else if left < wait {
			wait = left
		}
	}
	if len(v.confirmed) == 0 {
		v.wait = wait
		return v
	}
	for _, f := range v.confirmed {
		delete(st.pending, fullKey(ns, f))
		c.rememberLocked(node, st, knownKey(ns, f), now)
	}
	return v
}

// rememberLocked records a confirmed forgery of node, forgetting the least recently repeated
// one when the node's record is full.
func (c *confirmer) rememberLocked(node string, st *nodeState, k string, now time.Time) {
	if _, ok := st.known[k]; !ok && len(st.known) >= MaxKnownPerNode {
		oldest, at := "", now
		for key, t := range st.known {
			if !t.After(at) {
				oldest, at = key, t
			}
		}
		delete(st.known, oldest)
	}
	st.known[k] = now
	if c.onKnown != nil {
		c.onKnown(node, len(st.known))
	}
}

// newNodeLocked adds a record for node, forgetting the node seen longest ago when there are
// MaxNodes already.
func (c *confirmer) newNodeLocked(node string) *nodeState {
	if len(c.nodes) >= MaxNodes {
		oldest := ""
		var at time.Time
		for n, st := range c.nodes {
			if oldest == "" || st.last.Before(at) {
				oldest, at = n, st.last
			}
		}
		c.dropNodeLocked(oldest)
	}
	st := &nodeState{pending: map[string]*pending{}, known: map[string]time.Time{}}
	c.nodes[node] = st
	return st
}

func (c *confirmer) dropNodeLocked(node string) {
	delete(c.nodes, node)
	if c.onKnown != nil {
		c.onKnown(node, 0)
	}
}

// sweepLocked forgets, at most once per window, what has expired.
func (c *confirmer) sweepLocked(now time.Time) {
	if now.Sub(c.lastSweep) < c.window {
		return
	}
	c.lastSweep = now
	for node, st := range c.nodes {
		for k, p := range st.pending {
			if now.Sub(p.last) > PendingTTL {
				delete(st.pending, k)
			}
		}
		before := len(st.known)
		for k, t := range st.known {
			if now.Sub(t) > KnownTTL {
				delete(st.known, k)
			}
		}
		switch {
		case len(st.pending) == 0 && len(st.known) == 0:
			c.dropNodeLocked(node)
		case len(st.known) != before && c.onKnown != nil:
			c.onKnown(node, len(st.known))
		}
	}
}

// isKnown tells whether the forged endpoint f of namespace ns repeats a forgery confirmed for
// node.
func (c *confirmer) isKnown(node, ns string, f Forged) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.nodes[node]
	if st == nil {
		return false
	}
	_, ok := st.known[knownKey(ns, f)]
	return ok
}

// remembered is how many nodes and forgeries (pending and confirmed) are held (tests).
func (c *confirmer) remembered() (nodes, pendingN, known int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.nodes {
		pendingN += len(st.pending)
		known += len(st.known)
	}
	return len(c.nodes), pendingN, known
}

// forgetSlice drops what is known of the slice of that name (deleted or clean); what is known
// of its node's forged endpoints stays (expiring), so that the same forgery under another name
// finds its window running.
func (c *confirmer) forgetSlice(name types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetSliceLocked(name)
}

func (c *confirmer) forgetSliceLocked(name types.NamespacedName) {
	uid := c.names[name]
	delete(c.names, name)
	delete(c.slice, uid)
}
