// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package scheduler

import "time"

// Fair sharing of the workers (development/AGENT.md, "Probe scheduling"). A probe cannot be
// taken back from a worker once it runs, and one that never gets an answer holds its worker
// for its whole timeoutSeconds: picking the next run fairly cannot free the workers such probes
// already hold. So no namespace may have more than its share of the pool in flight
// (namespaceCap), and the free workers go to the namespace with the fewest runs in flight, and
// within it to the resource with the fewest runs in flight (pick).
//
// The cap divides the pool by the namespaces that have targets now, so a namespace alone on a
// node may fill the pool, and a namespace that arrives later would wait for those runs to end
// (up to the largest timeoutSeconds). So a reserve of the pool (reserveFor) is kept for the
// namespaces with no run in flight: a namespace with runs in flight starts one more only while
// more than the reserve is free, and an arriving namespace's first run takes a reserved worker
// at once.

// namespaceCap is the most runs one namespace may have in flight: the pool divided by the
// namespaces that have targets, never below one. Every namespace with targets counts, not only
// those with a run due right now: a namespace counted only while its run is due would find
// every worker already held by the others.
func namespaceCap(workers, namespaces int) int {
	if namespaces <= 0 {
		return max(workers, 1)
	}
	return max(workers/namespaces, 1)
}

// reserveFor is how many workers of a pool of the given size only a namespace with no run in
// flight may take: an eighth of the pool, at least one. A pool of one worker has no reserve:
// its one worker is the whole pool, and a run that never gets an answer holds it until its
// timeout, whoever waits.
func reserveFor(workers int) int {
	if workers < 2 {
		return 0
	}
	return max(workers/8, 1)
}

// candidate is a resource with at least one due run waiting for a worker, as pick weighs it.
type candidate struct {
	// Namespace of the resource.
	Namespace string
	// NamespaceRunning is how many runs of its namespace are in flight.
	NamespaceRunning int
	// ResourceRunning is how many runs of the resource are in flight.
	ResourceRunning int
	// Due is when the resource's earliest waiting run was due.
	Due time.Time
}

// pick chooses which waiting run takes a free worker and returns the index of its candidate,
// or -1 when none may start. free is how many workers are free, reserve how many of them only
// a namespace with no run in flight may take (reserveFor). A namespace with nsCap runs in
// flight starts nothing more, nor one with any run in flight while free <= reserve. Among
// the others, the namespace with the fewest runs in flight goes first (ties: the one whose run
// has waited longest), and within that namespace the resource with the fewest runs in flight
// (ties: the one that has waited longest). Without contention (nothing in flight) this is the
// earliest due run first, as with one queue.
func pick(cands []candidate, nsCap, free, reserve int) int {
	if free <= 0 {
		return -1
	}
	// The namespace: fewest in flight, then the earliest due of its candidates.
	best := -1
	for i, c := range cands {
		if c.NamespaceRunning >= nsCap || (c.NamespaceRunning > 0 && free <= reserve) {
			continue
		}
		if best < 0 || c.NamespaceRunning < cands[best].NamespaceRunning ||
			(c.NamespaceRunning == cands[best].NamespaceRunning && c.Due.Before(cands[best].Due)) {
			best = i
		}
	}
	if best < 0 {
		return -1
	}
	// The resource within that namespace: fewest in flight, then the earliest due.
	ns := cands[best].Namespace
	for i, c := range cands {
		if c.Namespace != ns {
			continue
		}
		b := cands[best]
		if c.ResourceRunning < b.ResourceRunning || (c.ResourceRunning == b.ResourceRunning && c.Due.Before(b.Due)) {
			best = i
		}
	}
	return best
}
