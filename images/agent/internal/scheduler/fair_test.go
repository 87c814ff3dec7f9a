// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package scheduler

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
)

func TestNamespaceCapIsThePoolDividedByTheNamespacesWithTargets(t *testing.T) {
	tests := map[string]struct {
		workers, namespaces, want int
	}{
		"one namespace may use the whole pool":            {64, 1, 64},
		"two namespaces get half each":                    {64, 2, 32},
		"the division rounds down so the shares fit":      {64, 3, 21},
		"more namespaces than workers still run one each": {64, 100, 1},
		"no namespace with targets leaves the whole pool": {64, 0, 64},
		"a pool of one is never capped below one":         {1, 5, 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, namespaceCap(tc.workers, tc.namespaces))
		})
	}
}

func TestPickSharesTheWorkersAcrossNamespacesThenResources(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tests := map[string]struct {
		cands []candidate
		cap   int
		want  int
	}{
		"nothing waiting starts nothing": {nil, 4, -1},
		"without runs in flight the earliest due goes first": {[]candidate{
			{Namespace: "a", Due: at(20)}, {Namespace: "b", Due: at(10)}, {Namespace: "a", Due: at(15)},
		}, 4, 1},
		"a namespace with fewer runs in flight goes before an earlier due one": {[]candidate{
			{Namespace: "noisy", NamespaceRunning: 3, ResourceRunning: 3, Due: at(0)},
			{Namespace: "calm", Due: at(50)},
		}, 4, 1},
		"a namespace at its cap starts nothing more, however late": {[]candidate{
			{Namespace: "noisy", NamespaceRunning: 2, ResourceRunning: 2, Due: at(0)},
		}, 2, -1},
		"the others still start while one namespace is at its cap": {[]candidate{
			{Namespace: "noisy", NamespaceRunning: 2, ResourceRunning: 2, Due: at(0)},
			{Namespace: "calm", NamespaceRunning: 1, ResourceRunning: 1, Due: at(30)},
		}, 2, 1},
		"equal runs in flight: the namespace that has waited longest": {[]candidate{
			{Namespace: "a", NamespaceRunning: 1, ResourceRunning: 1, Due: at(30)},
			{Namespace: "b", NamespaceRunning: 1, ResourceRunning: 1, Due: at(20)},
		}, 4, 1},
		"within the namespace the resource with fewer runs in flight goes first": {[]candidate{
			{Namespace: "a", NamespaceRunning: 3, ResourceRunning: 3, Due: at(0)},
			{Namespace: "a", NamespaceRunning: 3, ResourceRunning: 0, Due: at(40)},
		}, 4, 1},
		"the namespace is chosen before the resource": {[]candidate{
			{Namespace: "a", NamespaceRunning: 2, ResourceRunning: 0, Due: at(0)},
			{Namespace: "b", NamespaceRunning: 1, ResourceRunning: 1, Due: at(40)},
		}, 4, 1},
		"within the namespace, equal runs in flight: the resource that has waited longest": {[]candidate{
			{Namespace: "a", NamespaceRunning: 2, ResourceRunning: 1, Due: at(30)},
			{Namespace: "a", NamespaceRunning: 2, ResourceRunning: 1, Due: at(10)},
			{Namespace: "b", NamespaceRunning: 3, ResourceRunning: 0, Due: at(0)},
		}, 4, 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			// Plenty of free workers and no reserve: only the cap and the order decide.
			assert.Equal(t, tc.want, pick(tc.cands, tc.cap, 64, 0))
		})
	}
}

func TestReserveIsAnEighthOfThePoolAndNoneForOneWorker(t *testing.T) {
	tests := map[string]struct{ workers, want int }{
		"the default pool of 64 keeps 8":                 {64, 8},
		"16 workers keep 2":                              {16, 2},
		"the division rounds down":                       {20, 2},
		"a small pool keeps at least one":                {2, 1},
		"seven workers keep one":                         {7, 1},
		"one worker is the whole pool: no reserve":       {1, 0},
		"no worker (never configured so) has no reserve": {0, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, reserveFor(tc.workers))
		})
	}
}

// A namespace with runs in flight may not take the reserved workers, a namespace with none may:
// whatever one namespace holds, another's first run starts at once.
func TestPickKeepsTheReserveForNamespacesWithNoRunInFlight(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	hog := func(running int, due time.Time) candidate {
		return candidate{Namespace: "hog", NamespaceRunning: running, ResourceRunning: running, Due: due}
	}
	tests := map[string]struct {
		cands               []candidate
		nsCap, free, reserv int
		want                int
	}{
		"a namespace alone with runs in flight cannot take the reserve": {[]candidate{
			hog(56, at(0)),
		}, 64, 8, 8, -1},
		"nor the last reserved worker": {[]candidate{
			hog(63, at(0)),
		}, 64, 1, 8, -1},
		"it takes the workers beyond the reserve": {[]candidate{
			hog(55, at(0)),
		}, 64, 9, 8, 0},
		"a namespace alone and with nothing in flight takes any worker": {[]candidate{
			hog(0, at(0)),
		}, 64, 1, 8, 0},
		"an arriving namespace takes a reserved worker, though the hog waited longer": {[]candidate{
			hog(56, at(0)), {Namespace: "new", Due: at(50)},
		}, 64, 8, 8, 1},
		"an arriving namespace takes the last free worker": {[]candidate{
			hog(63, at(0)), {Namespace: "new", Due: at(50)},
		}, 64, 1, 8, 1},
		"many arriving namespaces: the one that has waited longest first": {[]candidate{
			hog(56, at(0)), {Namespace: "b", Due: at(30)}, {Namespace: "c", Due: at(10)}, {Namespace: "d", Due: at(20)},
		}, 16, 3, 8, 2},
		"an arrived namespace with a run in flight no longer takes the reserve": {[]candidate{
			hog(56, at(0)), {Namespace: "b", NamespaceRunning: 1, ResourceRunning: 1, Due: at(30)},
		}, 16, 7, 8, -1},
		"beyond the reserve the fewest in flight goes first again": {[]candidate{
			hog(40, at(0)), {Namespace: "b", NamespaceRunning: 1, ResourceRunning: 1, Due: at(30)},
		}, 32, 20, 8, 1},
		"no free worker starts nothing": {[]candidate{
			{Namespace: "new", Due: at(0)},
		}, 64, 0, 8, -1},
		"one worker, no reserve: whoever waits longest runs when it is free": {[]candidate{
			hog(0, at(0)), {Namespace: "new", Due: at(50)},
		}, 1, 1, 0, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, pick(tc.cands, tc.nsCap, tc.free, tc.reserv))
		})
	}
}

func nsTarget(ns, resource, pod string, period time.Duration) Target {
	tg := target(pod, 0, period, 1, 3)
	r := types.NamespacedName{Namespace: ns, Name: resource}
	tg.Key.Resource, tg.Namespace = r, ns
	return tg
}

// peak tracks how many runs are in flight and the most there ever were.
type peak struct{ now, max atomic.Int32 }

func (p *peak) enter() {
	n := p.now.Add(1)
	for {
		m := p.max.Load()
		if n <= m || p.max.CompareAndSwap(m, n) {
			return
		}
	}
}

func (p *peak) leave() { p.now.Add(-1) }

// A namespace whose probes hang holds at most its share of the pool (4 workers, 2 namespaces
// with targets: 2), and the other namespace's probe keeps running on the workers left free.
// Once it is the only namespace with targets, the same namespace uses the whole pool but its
// reserve (reserveFor: 1 of 4).
func TestAHangingNamespaceHoldsAtMostItsShareAndTheOthersKeepRunning(t *testing.T) {
	var hanging peak
	var calmRuns atomic.Int32
	s, _ := harness(t, Options{
		Workers: 4,
		Runner: RunnerFunc(func(ctx context.Context, tg Target) Outcome {
			if tg.Namespace == "noisy" {
				hanging.enter()
				defer hanging.leave()
				<-ctx.Done() // never answers: until its timeout (60 s) or removal
				return Outcome{Reason: "timeout"}
			}
			calmRuns.Add(1)
			return Outcome{Pass: true}
		}),
		MaxStartSpread: time.Millisecond,
	})
	calm := types.NamespacedName{Namespace: "calm", Name: "web"}
	s.Set(calm, []Target{nsTarget("calm", "web", "w", 10*time.Millisecond)})
	noisy := types.NamespacedName{Namespace: "noisy", Name: "hang"}
	var hangs []Target
	for i := range 10 {
		tg := nsTarget("noisy", "hang", fmt.Sprintf("h%d", i), 10*time.Millisecond)
		tg.Probe.TimeoutSeconds = 60
		hangs = append(hangs, tg)
	}
	s.Set(noisy, hangs)
	require.Eventually(t, func() bool { return hanging.now.Load() == 2 }, 10*time.Second, 5*time.Millisecond)
	start := calmRuns.Load()
	require.Eventually(t, func() bool { return calmRuns.Load() >= start+20 }, 10*time.Second, 5*time.Millisecond,
		"the calm namespace's probe runs beside the hanging ones")
	assert.Equal(t, int32(2), hanging.now.Load(), "the noisy namespace has its share in flight, its other runs wait")
	assert.Equal(t, int32(2), hanging.max.Load(), "and never had more")

	s.Set(calm, nil)
	require.Eventually(t, func() bool { return hanging.now.Load() == 3 }, 10*time.Second, 5*time.Millisecond,
		"alone, the namespace may use every worker but the reserve")
	assert.Equal(t, int32(3), hanging.max.Load(), "and never more")
}

// The agent's own lateness decides nothing: a probe that waits for a worker longer than its
// period passes when it runs and passes, and a probe that runs into its timeout fails. The late
// runs are counted, reported once per interval for their resource, and the runner sees when
// the run was due.
func TestLateRunsAreReportedAndChangeNoResult(t *testing.T) {
	type report struct {
		resource types.NamespacedName
		lateness time.Duration
	}
	var mu sync.Mutex
	var reports []report
	var lateSeen atomic.Bool
	late := types.NamespacedName{Namespace: "late", Name: "db"}
	const period = 10 * time.Millisecond
	s, m := harness(t, Options{
		// Two namespaces with targets: one run each at a time.
		Workers: 2,
		Runner: RunnerFunc(func(ctx context.Context, tg Target) Outcome {
			due, ok := Due(ctx)
			if !ok {
				return Outcome{Err: fmt.Errorf("no due time in the run's context")}
			}
			if tg.PodName == "hang" {
				<-ctx.Done() // into the scheduler's deadline: timeoutSeconds + 1 s
				return Outcome{Reason: "timeout: " + ctx.Err().Error()}
			}
			if tg.Namespace == "late" && time.Since(due) > period {
				lateSeen.Store(true)
			}
			return Outcome{Pass: true}
		}),
		OnLate: func(r types.NamespacedName, l time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			reports = append(reports, report{r, l})
		},
		LateReportInterval: time.Hour,
		MaxStartSpread:     time.Millisecond,
	})
	hang := nsTarget("late", "db", "hang", period)
	hang.Probe.FailureThreshold = 1
	pass := nsTarget("late", "db", "pass", period)
	s.Set(late, []Target{hang, pass})
	other := types.NamespacedName{Namespace: "other", Name: "web"}
	s.Set(other, []Target{nsTarget("other", "web", "w", time.Hour)})

	// Each time the hanging probe holds the namespace's one slot (2 s), the passing probe waits
	// for it far longer than its period.
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.LateRuns) >= 2 }, 30*time.Second, 10*time.Millisecond)
	res := s.Results(late)
	passed, _ := res.Of(pass.Key)
	assert.Equal(t, portrule.Pass, passed.State, "a late run that passes passes")
	assert.Empty(t, passed.Reason, "a late run that passes passes")
	hung, _ := res.Of(hang.Key)
	assert.Equal(t, portrule.Fail, hung.State, "a run into its timeout is a failure")
	assert.Contains(t, hung.Reason, "timeout")
	assert.True(t, lateSeen.Load(), "the runner saw a due time more than a period ago")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, reports, 1, "one report per resource and interval, though %v runs were late", testutil.ToFloat64(m.LateRuns))
	assert.Equal(t, late, reports[0].resource)
	assert.Greater(t, reports[0].lateness, period)
}
