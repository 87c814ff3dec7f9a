// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// LoadBalancerOptions describe a simulated external load balancer in front of the nodes, the
// way a cloud load balancer fronts a Service of type LoadBalancer with
// externalTrafficPolicy: Local: it polls every node's healthCheckNodePort over HTTP at the
// node's address and sends new connections only to the node ports of the nodes it considers
// healthy. It runs from the cluster namespace, outside every node.
type LoadBalancerOptions struct {
	// Nodes it balances over, by name; nil means every node of the cluster.
	Nodes []string
	// HealthCheckNodePort is the Service's spec.healthCheckNodePort.
	HealthCheckNodePort int32
	// HealthCheckPath is the path it asks for (default "/healthz"; kube-proxy answers any).
	HealthCheckPath string
	// CheckInterval is the time between the starts of two checks of a node (default 100 ms).
	CheckInterval time.Duration
	// CheckTimeout bounds one check, connect to body (default 1 s).
	CheckTimeout time.Duration
	// HealthyThreshold is how many 200 answers in a row make an unhealthy node healthy
	// (default 2); every node starts unhealthy.
	HealthyThreshold int
	// UnhealthyThreshold is how many other answers (a status other than 200, no answer) in a
	// row make a healthy node unhealthy (default 2).
	UnhealthyThreshold int
	// NodePort is where Traffic sends requests on the chosen node (TrafficOptions.Port
	// overrides it).
	NodePort int32
}

// HealthCheck is one answer of a node's health check node port.
type HealthCheck struct {
	// Start is when the check started.
	Start time.Time
	// Duration from start to the end of the body (or the error).
	Duration time.Duration
	// Status is the HTTP status (0 without an answer).
	Status int
	// LocalEndpoints is the "localEndpoints" field of kube-proxy's JSON body: how many local
	// endpoints kube-proxy counts for the Service on this node; -1 when the body had none.
	LocalEndpoints int
	// ServiceProxyHealthy is the body's "serviceProxyHealthy" (kube-proxy's own health).
	ServiceProxyHealthy bool
	// Service is the body's service as "namespace/name".
	Service string
	// Err says why there was no usable answer; empty otherwise.
	Err string
}

// OK reports whether the node passed the check (status 200).
func (h HealthCheck) OK() bool { return h.Status == http.StatusOK }

// String is the answer in a few words, for failure messages.
func (h HealthCheck) String() string {
	if h.Err != "" {
		return fmt.Sprintf("%s: %s", h.Start.Format("15:04:05.000"), h.Err)
	}
	return fmt.Sprintf("%s: %d localEndpoints=%d", h.Start.Format("15:04:05.000"), h.Status, h.LocalEndpoints)
}

// HealthChecks are the answers of one node, in order.
type HealthChecks []HealthCheck

// Since returns the checks that started at or after t.
func (hs HealthChecks) Since(t time.Time) HealthChecks {
	return keep(hs, func(h HealthCheck) bool { return !h.Start.Before(t) })
}

// Before returns the checks that started before t.
func (hs HealthChecks) Before(t time.Time) HealthChecks {
	return keep(hs, func(h HealthCheck) bool { return h.Start.Before(t) })
}

// NotOK returns the checks the node failed.
func (hs HealthChecks) NotOK() HealthChecks {
	return keep(hs, func(h HealthCheck) bool { return !h.OK() })
}

// FirstNotOK is the first failed check, false when there is none.
func (hs HealthChecks) FirstNotOK() (HealthCheck, bool) {
	for _, h := range hs {
		if !h.OK() {
			return h, true
		}
	}
	return HealthCheck{}, false
}

// FirstOK is the first passed check, false when there is none.
func (hs HealthChecks) FirstOK() (HealthCheck, bool) {
	for _, h := range hs {
		if h.OK() {
			return h, true
		}
	}
	return HealthCheck{}, false
}

// String summarises the checks for failure messages: counts by status and the first failure.
func (hs HealthChecks) String() string {
	by := map[int]int{}
	for _, h := range hs {
		by[h.Status]++
	}
	s := fmt.Sprintf("%d checks, by status %v", len(hs), by)
	if f, ok := hs.FirstNotOK(); ok {
		s += ", first failure " + f.String()
	}
	return s
}

// HealthChange is a change of the load balancer's view of a node.
type HealthChange struct {
	// At is the end of the check that made the change.
	At time.Time
	// Healthy is the new view.
	Healthy bool
}

// LoadBalancer is a running simulated load balancer.
type LoadBalancer struct {
	opts   LoadBalancerOptions
	nodes  []NodeInfo
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	checks  map[string]HealthChecks
	healthy map[string]bool
	streak  map[string]int
	changes map[string][]HealthChange
	next    int
}

// LoadBalancer starts a simulated load balancer that stops when the test ends.
func (c *Cluster) LoadBalancer(t testing.TB, opts LoadBalancerOptions) *LoadBalancer {
	t.Helper()
	lb, err := c.StartLoadBalancer(context.Background(), opts)
	if err != nil {
		t.Fatalf("load balancer: %v", err)
	}
	t.Cleanup(lb.Stop)
	return lb
}

// StartLoadBalancer is LoadBalancer without a test: it checks until Stop or until ctx ends.
func (c *Cluster) StartLoadBalancer(ctx context.Context, opts LoadBalancerOptions) (*LoadBalancer, error) {
	if opts.HealthCheckNodePort <= 0 {
		return nil, errors.New("no HealthCheckNodePort: the Service has none unless it is a LoadBalancer with externalTrafficPolicy: Local")
	}
	if opts.HealthCheckPath == "" {
		opts.HealthCheckPath = "/healthz"
	}
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = 100 * time.Millisecond
	}
	if opts.CheckTimeout <= 0 {
		opts.CheckTimeout = time.Second
	}
	if opts.HealthyThreshold <= 0 {
		opts.HealthyThreshold = 2
	}
	if opts.UnhealthyThreshold <= 0 {
		opts.UnhealthyThreshold = 2
	}
	lb := &LoadBalancer{
		opts: opts, checks: map[string]HealthChecks{}, healthy: map[string]bool{},
		streak: map[string]int{}, changes: map[string][]HealthChange{},
	}
	if opts.Nodes == nil {
		lb.nodes = append(lb.nodes, c.Nodes...)
	}
	for _, name := range opts.Nodes {
		found := false
		for _, n := range c.Nodes {
			if n.Name == name {
				lb.nodes, found = append(lb.nodes, n), true
			}
		}
		if !found {
			return nil, fmt.Errorf("no node %q in the cluster", name)
		}
	}
	ctx, lb.cancel = context.WithCancel(ctx)
	for _, n := range lb.nodes {
		lb.wg.Go(func() { lb.checkLoop(ctx, n) })
	}
	return lb, nil
}

// Stop ends the health checks; the view of the nodes stays as it was last, so traffic loops
// still running go on with it.
func (lb *LoadBalancer) Stop() {
	lb.cancel()
	lb.wg.Wait()
}

func (lb *LoadBalancer) checkLoop(ctx context.Context, n NodeInfo) {
	hc := &http.Client{
		Timeout: lb.opts.CheckTimeout,
		// A new connection for every check, as load balancers' health checkers do.
		Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true},
		// A redirect is an answer, not something to follow.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	defer hc.CloseIdleConnections()
	url := "http://" + net.JoinHostPort(n.IP.String(), strconv.Itoa(int(lb.opts.HealthCheckNodePort))) + lb.opts.HealthCheckPath
	for {
		start := time.Now()
		h := check(ctx, hc, url)
		h.Start, h.Duration = start, time.Since(start)
		if ctx.Err() != nil {
			return // a check cut short by Stop is not an answer
		}
		lb.record(n.Name, h)
		if wait := lb.opts.CheckInterval - time.Since(start); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
	}
}

// check asks once and reads kube-proxy's JSON body (bounded).
func check(ctx context.Context, hc *http.Client, url string) HealthCheck {
	h := HealthCheck{LocalEndpoints: -1}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		h.Err = err.Error()
		return h
	}
	resp, err := hc.Do(req)
	if err != nil {
		h.Err = err.Error()
		return h
	}
	defer func() { _ = resp.Body.Close() }()
	h.Status = resp.StatusCode
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		h.Err = "reading the body: " + err.Error()
		return h
	}
	var doc struct {
		Service struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"service"`
		LocalEndpoints      *int `json:"localEndpoints"`
		ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		h.Err = fmt.Sprintf("status %d with a body that is not kube-proxy's JSON: %q", h.Status, strings.TrimSpace(string(body)))
		return h
	}
	if doc.LocalEndpoints != nil {
		h.LocalEndpoints = *doc.LocalEndpoints
	}
	h.ServiceProxyHealthy = doc.ServiceProxyHealthy
	if doc.Service.Name != "" {
		h.Service = doc.Service.Namespace + "/" + doc.Service.Name
	}
	return h
}

// record keeps the answer and moves the node's view by the thresholds.
func (lb *LoadBalancer) record(node string, h HealthCheck) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	lb.checks[node] = append(lb.checks[node], h)
	if h.OK() == lb.healthy[node] {
		lb.streak[node] = 0
		return
	}
	lb.streak[node]++
	need := lb.opts.HealthyThreshold
	if lb.healthy[node] {
		need = lb.opts.UnhealthyThreshold
	}
	if lb.streak[node] >= need {
		lb.healthy[node] = !lb.healthy[node]
		lb.streak[node] = 0
		lb.changes[node] = append(lb.changes[node], HealthChange{At: h.Start.Add(h.Duration), Healthy: lb.healthy[node]})
	}
}

// Checks returns every answer of the node so far.
func (lb *LoadBalancer) Checks(node string) HealthChecks {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return append(HealthChecks(nil), lb.checks[node]...)
}

// Healthy reports whether the load balancer sends new connections to the node now.
func (lb *LoadBalancer) Healthy(node string) bool {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.healthy[node]
}

// Changes returns the changes of the load balancer's view of the node, in order.
func (lb *LoadBalancer) Changes(node string) []HealthChange {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return append([]HealthChange(nil), lb.changes[node]...)
}

// pick chooses the next healthy node, round robin; false when none is healthy.
func (lb *LoadBalancer) pick() (NodeInfo, bool) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	for range lb.nodes {
		n := lb.nodes[lb.next%len(lb.nodes)]
		lb.next++
		if lb.healthy[n.Name] {
			return n, true
		}
	}
	return NodeInfo{}, false
}

// Traffic starts a request loop through the load balancer: every request (a new connection)
// goes to the node port of the next node the load balancer considers healthy at that moment,
// round robin; with no healthy node the request fails. opts.Service and opts.Address are
// ignored; opts.Port, when set, replaces LoadBalancerOptions.NodePort. It stops when the test
// ends at the latest.
func (lb *LoadBalancer) Traffic(t testing.TB, opts TrafficOptions) *Traffic {
	t.Helper()
	if opts.Count <= 0 && opts.Duration <= 0 {
		t.Fatal("traffic: set Count or Duration: the loop must end by itself")
	}
	tr, err := lb.StartTraffic(context.Background(), opts)
	if err != nil {
		t.Fatalf("traffic: %v", err)
	}
	t.Cleanup(func() { tr.Stop() })
	return tr
}

// StartTraffic is Traffic without a test: the loop runs until Count or Duration is reached, or
// ctx ends, or Stop.
func (lb *LoadBalancer) StartTraffic(ctx context.Context, opts TrafficOptions) (*Traffic, error) {
	if opts.Port <= 0 {
		opts.Port = lb.opts.NodePort
	}
	if opts.Port <= 0 {
		return nil, errors.New("no node port: set LoadBalancerOptions.NodePort or TrafficOptions.Port")
	}
	return startLoop(ctx, opts, func(ctx context.Context, tr *Traffic, opts TrafficOptions) { tr.runBalanced(ctx, lb, opts) }), nil
}

// runBalanced is Traffic.run with the target chosen per request by the load balancer.
func (tr *Traffic) runBalanced(ctx context.Context, lb *LoadBalancer, opts TrafficOptions) {
	port := strconv.Itoa(int(opts.Port))
	tr.loop(ctx, opts, func(ctx context.Context, hc *http.Client, res *Result) {
		n, ok := lb.pick()
		if !ok {
			res.Err = "the load balancer has no healthy node"
			return
		}
		send(ctx, hc, net.JoinHostPort(n.IP.String(), port), opts, res)
		if !res.OK {
			res.Err = "via " + n.Name + ": " + res.Err
		}
	})
}
