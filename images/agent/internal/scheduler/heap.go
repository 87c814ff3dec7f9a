// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package scheduler

// entryHeap is a min-heap of entries by due time: the timers, and each resource's queue of due
// runs. Every run passes through it twice, so it is built for that: four children per node
// (half the depth of a binary heap) and the due time kept inline as nanoseconds, so that ordering
// compares integers without reading the entries (10 000 of them do not fit in a cache). Each
// entry knows its index, for removal.
type entryHeap []heapItem

type heapItem struct {
	when int64 // the entry's due time, as nanoseconds from the scheduler's epoch
	e    *entry
}

// push adds e, due at when.
func (h *entryHeap) push(e *entry, when int64) {
	*h = append(*h, heapItem{when: when, e: e})
	h.up(len(*h) - 1)
}

// pop removes and returns the earliest entry; the heap must not be empty.
func (h *entryHeap) pop() *entry {
	return h.remove(0)
}

// remove removes and returns the entry at index i.
func (h *entryHeap) remove(i int) *entry {
	old := *h
	e := old[i].e
	last := len(old) - 1
	if i != last {
		old[i] = old[last]
		old[i].e.index = i
	}
	old[last] = heapItem{} // keep no entry alive
	*h = old[:last]
	if i != last {
		if !h.down(i) {
			h.up(i)
		}
	}
	e.index = -1
	return e
}

// up moves the item at i towards the root until its parent is not later.
func (h entryHeap) up(i int) {
	it := h[i]
	for i > 0 {
		parent := (i - 1) / 4
		if h[parent].when <= it.when {
			break
		}
		h[i] = h[parent]
		h[i].e.index = i
		i = parent
	}
	h[i] = it
	it.e.index = i
}

// down moves the item at i towards the leaves until no child is earlier; it tells whether the
// item moved.
func (h entryHeap) down(i int) bool {
	start := i
	it := h[i]
	n := len(h)
	for {
		first := 4*i + 1
		if first >= n {
			break
		}
		// The earliest of up to four children.
		child := first
		for c := first + 1; c < min(first+4, n); c++ {
			if h[c].when < h[child].when {
				child = c
			}
		}
		if it.when <= h[child].when {
			break
		}
		h[i] = h[child]
		h[i].e.index = i
		i = child
	}
	h[i] = it
	it.e.index = i
	return i != start
}
