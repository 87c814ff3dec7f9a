// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A request under way when the loop's Duration ends runs to its own end and counts: the loop only
// stops starting requests. Before, the loop's deadline was the request's too, so a slow request
// (a MySQL login on a loaded machine) straddling it failed with "i/o timeout" and could be
// counted as a failure.
func TestALoopsDurationEndsItsStartsNotTheRequestUnderWay(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	opts := TrafficOptions{Duration: 20 * time.Millisecond, Interval: time.Millisecond, Timeout: time.Minute}
	tr := &Traffic{cancel: cancel, done: make(chan struct{}), until: loopEnd(opts)}
	calls := 0
	go tr.loop(ctx, opts, func(ctx context.Context, _ *http.Client, res *Result) {
		calls++
		// The first request lasts past the loop's end: it answers once the Duration is over,
		// unless its context ends first.
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for !tr.over() {
			select {
			case <-ctx.Done():
				res.Err = "cut short: " + ctx.Err().Error()
				return
			case <-tick.C:
			}
		}
		res.OK, res.Pod = true, "ns/slow"
	})
	rs := tr.Wait()
	require.Len(t, rs, 1, "the one request started before the end, and nothing after it")
	assert.True(t, rs[0].OK, "the request under way ran to its end: %s", rs[0].Err)
	assert.Equal(t, 1, calls)

	// Stop still cuts the request under way, and that request is not a result.
	ctx, cancel = context.WithCancel(t.Context())
	tr = &Traffic{cancel: cancel, done: make(chan struct{})}
	started := make(chan struct{})
	go tr.loop(ctx, TrafficOptions{Count: 1, Timeout: time.Minute}, func(ctx context.Context, _ *http.Client, res *Result) {
		close(started)
		<-ctx.Done()
		res.Err = ctx.Err().Error()
	})
	<-started
	assert.Empty(t, tr.Stop())
}
