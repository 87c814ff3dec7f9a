// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"container/list"
	"context"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
)

// The audit's work queue is fair between nodes (development/CONTROLLER.md, "Fairness between
// nodes"): a first-in-first-out queue lets a compromised node that writes a flood of slices
// delay the audit of every other node's slices behind the whole flood. Requests are grouped by
// the node of the slice they name and the workers take them round-robin across nodes, so a
// node's flood costs another node's slice at most one audit per flooding node ahead of it.
//
// Only the order is ours. client-go's workqueue.Typed keeps the contract the controller relies
// on (a key already queued is not queued twice, a key being processed is handed to no second
// worker and is queued again at Done when it was added meanwhile, ShutDown and
// ShutDownWithDrain) and calls the storage, fairOrder, under its own lock; its delaying and
// rate limiting layers are stacked on top exactly as controller-runtime stacks them on its FIFO.

// noNode is the group of requests whose slice the cache does not hold (deleted, or not seen
// yet): they are audited in turn like one node's.
const noNode = ""

// fairOrder is a workqueue.Queue that pops round-robin across groups (the nodes of the slices)
// and first in, first out within a group. It is not safe for concurrent use: workqueue.Typed
// calls it under its lock.
type fairOrder[T comparable] struct {
	// groupOf names the group of an item; it is called once per Push.
	groupOf func(T) string
	// groups are the queued items of each group, oldest first.
	groups map[string]*group[T]
	// ring holds the groups with items, the next one to serve at the front (element values are
	// group names).
	ring *list.List
	n    int
}

// group is one group's queued items and its place in the ring.
type group[T comparable] struct {
	items []T
	elem  *list.Element
}

func newFairOrder[T comparable](groupOf func(T) string) *fairOrder[T] {
	return &fairOrder[T]{groupOf: groupOf, groups: map[string]*group[T]{}, ring: list.New()}
}

// Touch does nothing: an item queued again keeps its place (workqueue.Typed does not push it
// twice).
func (q *fairOrder[T]) Touch(T) {}

// Push queues item at the end of its group; a group that had nothing queued joins the ring
// last, behind every group that waits already.
func (q *fairOrder[T]) Push(item T) {
	name := q.groupOf(item)
	g := q.groups[name]
	if g == nil {
		g = &group[T]{elem: q.ring.PushBack(name)}
		q.groups[name] = g
	}
	g.items = append(g.items, item)
	q.n++
}

// Len is the number of queued items.
func (q *fairOrder[T]) Len() int { return q.n }

// Pop takes the oldest item of the group at the front of the ring and moves that group to the
// back (or out of the ring, when it has nothing left). workqueue.Typed calls it only when Len is
// not 0.
func (q *fairOrder[T]) Pop() T {
	front := q.ring.Front()
	name, _ := front.Value.(string)
	g := q.groups[name]
	item := g.items[0]
	var zero T
	g.items[0] = zero // Let the popped item be collected.
	g.items = g.items[1:]
	q.n--
	if len(g.items) == 0 {
		q.ring.Remove(front)
		delete(q.groups, name)
	} else {
		q.ring.MoveToBack(front)
	}
	return item
}

// newFairQueue is the rate limiting queue of controller-runtime's own choice (client-go's
// delaying and rate limiting layers, rateLimiter, metrics under name) over fairOrder: the
// shape controller.Options.NewQueue asks for. clk is the delays' clock (nil: the real one).
func newFairQueue[T comparable](name string, rateLimiter workqueue.TypedRateLimiter[T], groupOf func(T) string, clk clock.WithTicker) workqueue.TypedRateLimitingInterface[T] {
	if clk == nil {
		clk = clock.RealClock{}
	}
	core := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[T]{Name: name, Clock: clk, Queue: newFairOrder(groupOf)})
	delaying := workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[T]{Name: name, Clock: clk, Queue: core})
	return workqueue.NewTypedRateLimitingQueueWithConfig(rateLimiter, workqueue.TypedRateLimitingQueueConfig[T]{
		Name: name, Clock: clk, DelayingQueue: delaying,
	})
}

// nodeOfRequest is the node of the slice a request names, read from the manager's cache
// without a copy (only an annotation or a label is read), or noNode when the cache does not
// hold it. It runs under the work queue's lock: a read of the informer's store, no request.
func nodeOfRequest(cache client.Reader) func(reconcile.Request) string {
	return func(req reconcile.Request) string {
		var s discoveryv1.EndpointSlice
		if err := cache.Get(context.Background(), req.NamespacedName, &s, client.UnsafeDisableDeepCopy); err != nil {
			return noNode
		}
		return slicemeta.NodeOf(&s)
	}
}

// fairQueue is controller.Options.NewQueue for the audit: requests grouped by the node of
// their slice (read from cache), served round-robin across nodes. onQueued, when set (tests), is
// called with each request queued and its node.
func fairQueue(cache client.Reader, onQueued func(reconcile.Request, string)) func(string, workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
	groupOf := nodeOfRequest(cache)
	if onQueued != nil {
		plain := groupOf
		groupOf = func(req reconcile.Request) string {
			node := plain(req)
			onQueued(req, node)
			return node
		}
	}
	return func(name string, rateLimiter workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
		return newFairQueue(name, rateLimiter, groupOf, nil)
	}
}
