// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// byPrefix groups the items "<node>/<n>" by node.
func byPrefix(item string) string {
	node, _, _ := strings.Cut(item, "/")
	return node
}

func testQueue(t *testing.T, clk *clocktesting.FakeClock) workqueue.TypedRateLimitingInterface[string] {
	t.Helper()
	var c clock.WithTicker // A nil *FakeClock is no nil clock.
	if clk != nil {
		c = clk
	}
	q := newFairQueue("", workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, time.Minute), byPrefix, c)
	t.Cleanup(q.ShutDown)
	return q
}

// getAll takes n items, marking each done.
func getAll(t *testing.T, q workqueue.TypedRateLimitingInterface[string], n int) []string {
	t.Helper()
	out := make([]string, 0, n)
	for range n {
		item, shutdown := q.Get()
		require.False(t, shutdown)
		q.Done(item)
		out = append(out, item)
	}
	return out
}

func TestFairQueueServesNodesRoundRobin(t *testing.T) {
	q := testQueue(t, nil)
	// A flood of node a, then one slice each of b and c, then more of a and b.
	for _, item := range []string{"a/1", "a/2", "a/3", "a/4", "b/1", "c/1", "a/5", "b/2"} {
		q.Add(item)
	}
	assert.Equal(t, 8, q.Len())
	assert.Equal(t, []string{"a/1", "b/1", "c/1", "a/2", "b/2", "a/3", "a/4", "a/5"}, getAll(t, q, 8),
		"each node in turn, oldest first within a node: b and c wait behind one of a's, not four")
	assert.Zero(t, q.Len())

	// A node that had nothing queued joins behind the nodes that wait already.
	for _, item := range []string{"a/1", "a/2", "b/1"} {
		q.Add(item)
	}
	assert.Equal(t, []string{"a/1"}, getAll(t, q, 1))
	q.Add("c/1")
	assert.Equal(t, []string{"b/1", "a/2", "c/1"}, getAll(t, q, 3))
}

func TestFairQueueKeepsTheWorkqueueContract(t *testing.T) {
	q := testQueue(t, nil)
	q.Add("a/1")
	q.Add("a/1")
	q.Add("b/1")
	assert.Equal(t, 2, q.Len(), "a key already queued is queued once")

	item, _ := q.Get()
	require.Equal(t, "a/1", item)
	q.Add("a/1") // Added again while a worker holds it.
	assert.Equal(t, 1, q.Len(), "a key being processed is not queued again")
	next, _ := q.Get()
	assert.Equal(t, "b/1", next, "a second worker is not handed the key being processed")
	q.Done(next)
	assert.Zero(t, q.Len())
	q.Done(item)
	assert.Equal(t, 1, q.Len(), "added while processed: queued again at Done")
	assert.Equal(t, []string{"a/1"}, getAll(t, q, 1))
	assert.Zero(t, q.Len())
}

func TestFairQueueDelaysAndRateLimitsWithTheGivenLimiter(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	q := testQueue(t, clk)
	q.AddAfter("a/1", 2*time.Second)
	q.AddRateLimited("b/1") // 1 s: the limiter's base delay.
	q.AddRateLimited("b/1") // 2 s: the second failure; the earlier time stands.
	assert.Equal(t, 2, q.NumRequeues("b/1"))
	assert.Zero(t, q.Len(), "nothing is queued before its time (the clock stands still)")
	// next steps the clock until something is queued and takes it.
	next := func(msg string) string {
		require.Eventually(t, func() bool { clk.Step(100 * time.Millisecond); return q.Len() > 0 }, 10*time.Second, time.Millisecond, msg)
		return getAll(t, q, 1)[0]
	}
	assert.Equal(t, "b/1", next("b/1 is queued after its delay"), "the shorter delay first")
	assert.Equal(t, "a/1", next("a/1 is queued after its delay"))
	q.Forget("b/1")
	assert.Zero(t, q.NumRequeues("b/1"), "Forget resets the limiter's count")
}

func TestFairQueueShutsDown(t *testing.T) {
	t.Run("ShutDown", func(t *testing.T) {
		q := testQueue(t, nil)
		q.ShutDown()
		_, shutdown := q.Get()
		assert.True(t, shutdown, "an empty queue that is shut down ends its workers")
		q.Add("a/1")
		assert.Zero(t, q.Len(), "nothing is queued after ShutDown")
		assert.True(t, q.ShuttingDown())
	})
	t.Run("ShutDownWithDrain", func(t *testing.T) {
		q := testQueue(t, nil)
		q.Add("a/1")
		q.Add("b/1")
		item, _ := q.Get()
		drained := make(chan struct{})
		go func() { q.ShutDownWithDrain(); close(drained) }()
		require.Eventually(t, q.ShuttingDown, 5*time.Second, time.Millisecond)
		next, shutdown := q.Get()
		require.False(t, shutdown, "what was queued is still handed out while draining")
		q.Done(next)
		select {
		case <-drained:
			t.Fatal("the drain returned while an item was being processed")
		default:
		}
		q.Done(item)
		require.Eventually(t, func() bool {
			select {
			case <-drained:
				return true
			default:
				return false
			}
		}, 5*time.Second, time.Millisecond, "the drain returns once every item is done")
		_, shutdown = q.Get()
		assert.True(t, shutdown)
	})
}

// sliceCache is a client.Reader that holds some slices (the manager's cache in nodeOfRequest).
type sliceCache struct {
	client.Reader
	slices map[types.NamespacedName]*discoveryv1.EndpointSlice
}

func (c sliceCache) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	s, ok := c.slices[key]
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, key.Name)
	}
	*obj.(*discoveryv1.EndpointSlice) = *s
	return nil
}

func TestFairQueueGroupsRequestsByTheNodeOfTheirSlice(t *testing.T) {
	onA := types.NamespacedName{Namespace: "ns", Name: "web-http-a"}
	onB := types.NamespacedName{Namespace: "ns", Name: "web-http-b"}
	cache := sliceCache{slices: map[types.NamespacedName]*discoveryv1.EndpointSlice{
		onA: {ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{wellknown.AnnotationNode: "a"}}},
		onB: {ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{wellknown.AnnotationNode: "b"}}},
	}}
	var queued []string
	newQueue := fairQueue(cache, func(_ reconcile.Request, node string) { queued = append(queued, node) })
	q := newQueue("", workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	t.Cleanup(q.ShutDown)
	gone := types.NamespacedName{Namespace: "ns", Name: "deleted"}
	for _, key := range []types.NamespacedName{onA, gone, onB} {
		q.Add(reconcile.Request{NamespacedName: key})
	}
	assert.Equal(t, []string{"a", noNode, "b"}, queued, "a slice the cache does not hold is queued in a group of its own")
}
