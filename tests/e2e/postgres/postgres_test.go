// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package postgres_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

// switchTimes are the measurements of one failover of db-write.
type switchTimes struct {
	// Bound is the decision bound of db-write (see decisionBound).
	Bound time.Duration
	// Switch is from the moment the old primary began to stop (after the promotion) to the
	// first request from which on every new connection reached the new primary (what a client
	// sees).
	Switch time.Duration
	// Routed is from the same moment until kube-proxy's rules sent new connections only to the
	// new primary (polled every 20 ms).
	Routed time.Duration
	// Promote is how long promoting the replica took (pg_ctl promote -w).
	Promote time.Duration
	// Stop is how long the old primary's fast shutdown took (pg_ctl stop -w): it refuses new
	// connections from its start, so the probes may see it gone before it has exited.
	Stop time.Duration
}

// failoverDBWrite runs scenario 1 on fresh databases and returns its measurements: a request
// loop through db-write's ClusterIP spans the failover (the replica promoted, then the old
// primary stopped); before it every request reaches the primary; after it new connections
// reach only the new primary within three times the decision bound.
func failoverDBWrite(t testing.TB, s *stack.Stack) switchTimes {
	t.Helper()
	c := s.Cluster
	d := startDatabases(t, s)
	bound := decisionBound(d.resource(t, c, "db-write"))
	svc := d.ns + "/db-write"
	loop := c.Traffic(t, cluster.TrafficOptions{Service: svc, Port: servicePort, Protocol: cluster.PostgreSQL, PostgreSQL: d.login,
		Interval: interval, Duration: loopLimit})
	waitRequests(t, loop, time.Time{}, minInWindow)

	promoting := time.Now()
	require.NoError(t, d.replica.Promote(t.Context()))
	stopping := time.Now()
	require.NoError(t, d.primary.Stop(t.Context()))
	stopped := time.Now()
	routed := waitRouted(t, c, svc, d.db1)
	waitRequests(t, loop, routed, minInWindow)
	// The loop runs at least until the end of the bound's window, so the window is full.
	waitRequests(t, loop, stopping.Add(bound), 1)
	res := loop.Stop()

	before := finishedBefore(res, promoting)
	require.GreaterOrEqual(t, len(before), minInWindow, "requests before the failover: %s", before)
	assert.Equal(t, map[string]int{d.db0.Key(): len(before)}, before.ByPod(), "before the failover every new connection reaches the primary: %s", before)
	inWindow := within(res, stopping, stopping.Add(bound))
	assert.GreaterOrEqual(t, len(inWindow), minInWindow, "requests inside the bound after the old primary began to stop: %s", inWindow)
	after := res.Since(routed)
	assert.GreaterOrEqual(t, len(after), minInWindow, "requests after kube-proxy switched: %s", after)
	assert.Equal(t, map[string]int{d.db1.Key(): len(after)}, after.ByPod(), "once switched every new connection reaches the new primary, none fails: %s", after)

	settled, n, ok := settledOn(res, d.db1.Key())
	require.True(t, ok, "the loop ends on the new primary: %s", res.Since(stopping))
	assert.GreaterOrEqual(t, n, minInWindow)
	m := switchTimes{Bound: bound, Switch: max(0, settled.Sub(stopping)), Routed: routed.Sub(stopping),
		Promote: stopping.Sub(promoting), Stop: stopped.Sub(stopping)}
	assert.LessOrEqual(t, m.Switch, 3*bound, "new connections reach only the new primary within 3x the bound")
	assert.LessOrEqual(t, m.Routed, 3*bound, "kube-proxy routes only to the new primary within 3x the bound")
	t.Logf("db-write switch: %v after the old primary began to stop (kube-proxy %v; promote took %v, stop %v; bound %v); requests: %d before, %d in the bound's window, %d after; failed in the window: %d",
		m.Switch.Round(time.Millisecond), m.Routed.Round(time.Millisecond), m.Promote.Round(time.Millisecond), m.Stop.Round(time.Millisecond), bound,
		len(before), len(inWindow), len(after), len(inWindow.Failed()))
	return m
}

// Scenario 1: db-write follows a failover.
func TestDBWriteNewConnectionsReachOnlyTheNewPrimaryAfterAFailover(t *testing.T) {
	s := testStack(t)
	failoverDBWrite(t, s)
}

// Scenario 2: db-read balances over the primary and the replica; a stopped replica leaves the
// read path within three times the decision bound (its endpoint is kept, not ready, not
// serving), and once kube-proxy no longer routes to it no request fails.
func TestDBReadDropsAStoppedReplicaAndNoRequestFailsOnceItLeft(t *testing.T) {
	s := testStack(t)
	c := s.Cluster
	d := startDatabases(t, s)
	bound := decisionBound(d.resource(t, c, "db-read"))
	svc := d.ns + "/db-read"
	loop := c.Traffic(t, cluster.TrafficOptions{Service: svc, Port: servicePort, Protocol: cluster.PostgreSQL, PostgreSQL: d.login,
		Interval: interval, Duration: loopLimit})
	// Enough requests that both servers have answered (each is picked at random per connection).
	waitRequests(t, loop, time.Time{}, 2*minInWindow)

	stopping := time.Now()
	require.NoError(t, d.replica.Stop(t.Context()))
	stopped := time.Now()
	left := waitRouted(t, c, svc, d.db0)
	waitRequests(t, loop, left, minInWindow)
	waitRequests(t, loop, stopping.Add(bound), 1)
	res := loop.Stop()

	before := finishedBefore(res, stopping)
	require.GreaterOrEqual(t, len(before), 2*minInWindow)
	assert.Empty(t, before.Failed(), "before the stop: %s", before)
	assert.Equal(t, []string{d.db0.Key(), d.db1.Key()}, before.Pods(), "db-read balances over both servers: %s", before)
	inWindow := within(res, stopping, stopping.Add(bound))
	assert.GreaterOrEqual(t, len(inWindow), minInWindow, "requests inside the bound after the replica began to stop: %s", inWindow)
	after := res.Since(left)
	assert.GreaterOrEqual(t, len(after), minInWindow, "requests after the replica left: %s", after)
	assert.Equal(t, map[string]int{d.db0.Key(): len(after)}, after.ByPod(), "once the replica left no request fails: %s", after)
	leftAfter := left.Sub(stopping)
	assert.LessOrEqual(t, leftAfter, 3*bound, "the stopped replica leaves the read path within 3x the bound")

	var slice discoveryv1.EndpointSlice
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: d.ns, Name: "db-read-postgres-node-b"}, &slice))
	assert.Equal(t, wellknown.ManagedBy, slice.Labels[discoveryv1.LabelManagedBy])
	require.Len(t, slice.Endpoints, 1)
	assert.Equal(t, d.db1.IP.String(), slice.Endpoints[0].Addresses[0])
	assert.False(t, *slice.Endpoints[0].Conditions.Ready, "the stopped replica is kept in its slice, not ready")
	assert.False(t, *slice.Endpoints[0].Conditions.Serving)
	t.Logf("db-read: the stopped replica left kube-proxy's rules %v after it began to stop (its stop took %v; bound %v); requests: %d before, %d in the bound's window (%d failed), %d after",
		leftAfter.Round(time.Millisecond), stopped.Sub(stopping).Round(time.Millisecond), bound, len(before), len(inWindow), len(inWindow.Failed()), len(after))
}
