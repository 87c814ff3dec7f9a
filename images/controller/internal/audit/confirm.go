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

// confirmer remembers since when each forged endpoint (slice UID, address, targetRef) and each
// slice has been seen forged, on an injected clock. Keys do not include the resourceVersion: a
// forger rewriting the slice does not restart the count.
type confirmer struct {
	mu     sync.Mutex
	window time.Duration
	since  map[types.UID]map[string]time.Time // slice UID → endpoint key → first seen
	slice  map[types.UID]time.Time            // slice UID → forged continuously since
	names  map[types.NamespacedName]types.UID // slice name → UID, to forget deleted slices
}

func newConfirmer(window time.Duration) *confirmer {
	return &confirmer{window: window, since: map[types.UID]map[string]time.Time{}, slice: map[types.UID]time.Time{}, names: map[types.NamespacedName]types.UID{}}
}

func endpointKey(f Forged) string { return f.Address + "|" + f.Pod }

// observe records the forged endpoints of slice uid seen at now (none: the slice is clean and
// forgotten). It returns the endpoints confirmed (seen for a window, or the slice forged for
// sliceWindows windows) and, when none is, how long until the next one may be.
func (c *confirmer) observe(name types.NamespacedName, uid types.UID, forged []Forged, now time.Time) ([]Forged, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev, ok := c.names[name]; ok && prev != uid {
		c.forgetLocked(name)
	}
	if len(forged) == 0 {
		c.forgetLocked(name)
		return nil, 0
	}
	c.names[name] = uid
	old := c.since[uid]
	cur := make(map[string]time.Time, len(forged))
	sliceSince, ok := c.slice[uid]
	if !ok {
		sliceSince = now
		c.slice[uid] = now
	}
	var confirmed []Forged
	wait := sliceSince.Add(sliceWindows * c.window).Sub(now)
	for _, f := range forged {
		k := endpointKey(f)
		first, seen := old[k]
		if !seen {
			first = now
		}
		cur[k] = first
		left := first.Add(c.window).Sub(now)
		if left <= 0 || wait <= 0 {
			confirmed = append(confirmed, f)
		} else if left < wait {
			wait = left
		}
	}
	c.since[uid] = cur
	if len(confirmed) > 0 {
		return confirmed, 0
	}
	return nil, wait
}

// forget drops what is known of the slice of that name (deleted or clean).
func (c *confirmer) forget(name types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetLocked(name)
}

func (c *confirmer) forgetLocked(name types.NamespacedName) {
	uid := c.names[name]
	delete(c.names, name)
	delete(c.since, uid)
	delete(c.slice, uid)
}
