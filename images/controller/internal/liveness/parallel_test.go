// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package liveness

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/slicewrite"
)

// writeGate holds every EndpointSlice update on its way to the API server until want of them
// are in flight at once (or until hold has passed, so that a withdrawal writing fewer at once
// still ends), and records the most that were.
type writeGate struct {
	want int
	hold time.Duration

	mu       sync.Mutex
	inFlight int
	most     int
	opened   bool
	open     chan struct{}
}

func (g *writeGate) wrap(next http.RoundTripper) http.RoundTripper {
	return promhttp.RoundTripperFunc(func(req *http.Request) (*http.Response, error) {
		if req.Method != http.MethodPut || !strings.Contains(req.URL.Path, "/endpointslices/") {
			return next.RoundTrip(req)
		}
		g.mu.Lock()
		g.inFlight++
		g.most = max(g.most, g.inFlight)
		if g.inFlight == g.want && !g.opened {
			g.opened = true
			close(g.open)
		}
		g.mu.Unlock()
		select {
		case <-g.open:
		case <-time.After(g.hold):
		}
		defer func() {
			g.mu.Lock()
			g.inFlight--
			g.mu.Unlock()
		}()
		return next.RoundTrip(req)
	})
}

// TestWithdrawerWritesTheSlicesOfStaleNodesInParallel: the slices of the stale nodes are
// updated WithdrawWriters at a time, not one after another (a lost zone's thousands of slices
// would otherwise take that many round trips in a row), and every one of them is withdrawn.
func TestWithdrawerWritesTheSlicesOfStaleNodesInParallel(t *testing.T) {
	// More fresh nodes than stale ones, so that the guard (more than half look stale) stays off.
	stale, fresh := make([]string, WithdrawWriters+2), make([]string, WithdrawWriters+3)
	for i := range stale {
		stale[i] = fmt.Sprintf("wd-p%d", i)
	}
	for i := range fresh {
		fresh[i] = fmt.Sprintf("wd-pfresh%d", i)
	}
	w := newWorld(t, append(fresh, stale...)...)
	gate := &writeGate{want: WithdrawWriters, hold: 2 * time.Second, open: make(chan struct{})}
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(gate.wrap)
	writer, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	w.w.Slices = slicewrite.New(writer, nil, w.metrics)
	w.passGrace(fresh...)

	v, err := w.w.Run(t.Context())
	require.NoError(t, err)

	assert.Equal(t, stale, v.Stale)
	require.False(t, v.Guarded, "the guard holds: %s", v.Reason)
	assert.Greater(t, gate.most, 1, "slice updates in flight at once: more than one")
	assert.Equal(t, WithdrawWriters, gate.most, "slice updates in flight at once")
	for _, n := range stale {
		assert.Equal(t, ptr.To(false), w.get(t, n).Endpoints[0].Conditions.Ready, "node %s's endpoint is withdrawn", n)
	}
	for _, n := range fresh {
		assert.Equal(t, ptr.To(true), w.get(t, n).Endpoints[0].Conditions.Ready, "fresh node %s's endpoint stays", n)
	}
	assert.InDelta(t, len(stale), testutil.ToFloat64(w.metrics.WithdrawnSlices), 0)
}
