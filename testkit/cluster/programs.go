// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// This file holds the variants of the test helpers for long-running programs (`make run`),
// which have no *testing.T: the caller stops what it starts, or the pod / context does.

// Serve starts a server speaking proto on the port of the pod without a test: it stops with
// the pod (Remove, Cluster.Stop) or by Server.Stop.
func (p *Pod) Serve(proto Protocol, port int) (*Server, error) {
	s := &Server{Pod: p, Protocol: proto, Port: port, conns: map[net.Conn]struct{}{}}
	s.status.Store(http.StatusOK)
	if err := s.Start(); err != nil {
		return nil, fmt.Errorf("starting %s server on %s port %d: %w", proto, p.Key(), port, err)
	}
	p.mu.Lock()
	p.servers[s] = struct{}{}
	p.mu.Unlock()
	return s, nil
}

// StartTraffic is Traffic without a test: the loop runs until Count or Duration is reached, or
// ctx ends, or Stop. Unlike Traffic it accepts a loop without Count and Duration (it then runs
// until ctx ends).
func (c *Cluster) StartTraffic(ctx context.Context, opts TrafficOptions) (*Traffic, error) {
	if ctx == nil {
		return nil, errors.New("traffic: nil context")
	}
	target, err := c.trafficTarget(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("traffic: %w", err)
	}
	opts.fromClientIP = !c.ciliumDataplane
	return startLoop(ctx, opts, func(ctx context.Context, tr *Traffic, opts TrafficOptions) { tr.run(ctx, target, opts) }), nil
}

// startLoop fills in the defaults of a loop's options (HTTP, a request every 10 ms, a 2 s
// timeout) and runs the loop in the background, under ctx, until Count, Duration (no request
// starts after it) or Stop: the common start of Cluster.Traffic, Cluster.StartTraffic and
// LoadBalancer.StartTraffic.
func startLoop(ctx context.Context, opts TrafficOptions, run func(ctx context.Context, tr *Traffic, opts TrafficOptions)) *Traffic {
	if opts.Protocol == "" {
		opts.Protocol = HTTP
	}
	if opts.Interval <= 0 {
		opts.Interval = 10 * time.Millisecond
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 2 * time.Second
	}
	// Duration ends the starting of requests (Traffic.until), not the one under way.
	loopCtx, cancel := context.WithCancel(ctx)
	tr := &Traffic{cancel: cancel, done: make(chan struct{}), until: loopEnd(opts)}
	go run(loopCtx, tr, opts)
	return tr
}
