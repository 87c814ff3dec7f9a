// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"

	"github.com/deckhouse/service-with-healthchecks/testkit/metrics"
)

// -apiserver-gc: where the API server's garbage collector meets the samples, and how much each
// side makes the API server allocate. Both read the API server's own /metrics (the Go
// collector's go_memstats_* series), which costs the API server a few MB of allocation per
// scrape itself: opt-in, and the poll is slow (gcPoll) so that it adds little.

// gcPoll is how often the API server's last GC end is read during the sampling. The series is
// the end time of the last cycle, exact whatever the poll; a poll only misses a cycle when two
// end within one poll, which go_gc_duration_seconds_count shows (gcWatch.missed).
const gcPoll = 2 * time.Second

// gcOverlap is how long after a sample's watch event a GC cycle may end and still count as
// overlapping that sample: the cycle's concurrent mark runs before its end, and the series
// gives only the end. Measured on the 2-vCPU VM of development/BENCHMARKS-HISTORY.md: every sample of
// either side over 40 ms at 1,000 endpoints had the next GC end during it or at most 0.14 s
// after its event, or more than 1 s after it.
const gcOverlap = 250 * time.Millisecond

// apiServer scrapes the API server's /metrics as the benchmark's admin.
type apiServer struct {
	hc  *http.Client
	url string
}

func newAPIServer(cfg *rest.Config) (*apiServer, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("an HTTP client for the API server: %w", err)
	}
	return &apiServer{hc: hc, url: strings.TrimSuffix(cfg.Host, "/") + "/metrics"}, nil
}

func (a *apiServer) scrape(ctx context.Context) (metrics.Families, error) {
	return metrics.Scrape(ctx, a.hc, a.url)
}

// gcWatch polls the API server's last GC end until stopped.
type gcWatch struct {
	mu     sync.Mutex
	ends   []time.Time // distinct ends of GC cycles, in order
	cycles [2]float64  // go_gc_duration_seconds_count at the first and the last poll
	polls  int
	errs   int
	stop   context.CancelFunc
	done   chan struct{}
}

func (a *apiServer) watchGC(ctx context.Context) *gcWatch {
	ctx, cancel := context.WithCancel(ctx)
	g := &gcWatch{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(g.done)
		t := time.NewTicker(gcPoll)
		defer t.Stop()
		for {
			g.poll(ctx, a)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return g
}

func (g *gcWatch) poll(ctx context.Context, a *apiServer) {
	fams, err := a.scrape(ctx)
	var last, count float64
	if err == nil {
		if last, err = fams.Value("go_memstats_last_gc_time_seconds"); err == nil {
			count, err = fams.Value("go_gc_duration_seconds_count")
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			g.errs++
		}
		return
	}
	if g.polls == 0 {
		g.cycles[0] = count
	}
	g.polls++
	g.cycles[1] = count
	end := time.Unix(0, int64(last*1e9))
	if last > 0 && (len(g.ends) == 0 || end.After(g.ends[len(g.ends)-1])) {
		g.ends = append(g.ends, end)
	}
}

// result stops the watch and returns the ends seen and how many cycles ended unseen (two or
// more within one poll).
func (g *gcWatch) result() (ends []time.Time, missed int, errs int) {
	g.stop()
	<-g.done
	g.mu.Lock()
	defer g.mu.Unlock()
	seen := max(len(g.ends)-1, 0) // the first end seen may precede the first poll
	return slices.Clone(g.ends), max(int(g.cycles[1]-g.cycles[0])-seen, 0), g.errs
}

// overlapsGC tells whether a GC cycle ended between the sample's start and gcOverlap after its
// watch event.
func overlapsGC(s sample, ends []time.Time) bool {
	i, _ := slices.BinarySearchFunc(ends, s.start, func(e, t time.Time) int { return e.Compare(t) })
	return i < len(ends) && !ends[i].After(s.start.Add(s.latency+gcOverlap))
}

// gcSplit is one side's samples split by overlapsGC.
type gcSplit struct{ hit, rest []time.Duration }

func splitByGC(ss []sample, ends []time.Time) gcSplit {
	var g gcSplit
	for _, s := range ss {
		if overlapsGC(s, ends) {
			g.hit = append(g.hit, s.latency)
		} else {
			g.rest = append(g.rest, s.latency)
		}
	}
	return g
}

// allocPhase is how long each phase of the allocation measurement lasts: the same wall-clock
// time for the idle phase and for each side's flips, so that the API server's background
// allocation (and the two scrapes around a phase) cancel out in the difference.
const allocPhase = 30 * time.Second

// allocFlips is how many flips one side makes in its phase (each endpoint down, then up).
const allocFlips = 20

// allocPerFlip measures, after the sampling, the API server's allocation per flip of each side:
// go_memstats_alloc_bytes_total over an idle phase, a phase of allocFlips agent flips and one
// of allocFlips built-in flips, each allocPhase long; per flip = (phase − idle) / allocFlips.
func (a *apiServer) allocPerFlip(ctx context.Context, agent, builtin func(ctx context.Context) error) (agentBytes, builtinBytes float64, err error) {
	phase := func(flip func(ctx context.Context) error) (float64, error) { // nil: idle
		before, err := a.scrape(ctx)
		if err != nil {
			return 0, err
		}
		start := time.Now()
		for i := 0; flip != nil && i < allocFlips; i++ {
			if err := flip(ctx); err != nil {
				return 0, err
			}
		}
		if left := allocPhase - time.Since(start); left > 0 {
			select { // the phase's fixed length (a measurement window, not a synchronisation)
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(left):
			}
		} else {
			return 0, fmt.Errorf("%d flips took %s, longer than the phase of %s", allocFlips, time.Since(start).Round(time.Millisecond), allocPhase)
		}
		after, err := a.scrape(ctx)
		if err != nil {
			return 0, err
		}
		return after.Sum("go_memstats_alloc_bytes_total", nil) - before.Sum("go_memstats_alloc_bytes_total", nil), nil
	}
	idle, err := phase(nil)
	if err != nil {
		return 0, 0, fmt.Errorf("the API server's allocation, idle: %w", err)
	}
	ag, err := phase(agent)
	if err != nil {
		return 0, 0, fmt.Errorf("the API server's allocation, agent flips: %w", err)
	}
	bi, err := phase(builtin)
	if err != nil {
		return 0, 0, fmt.Errorf("the API server's allocation, built-in flips: %w", err)
	}
	return (ag - idle) / allocFlips, (bi - idle) / allocFlips, nil
}
