// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// TrafficOptions describe a bounded request loop. It stops by itself after Count requests or
// after Duration, whichever comes first; one of them must be set. A request started before
// Duration ends runs to its end or its Timeout.
type TrafficOptions struct {
	// Service is "namespace/name"; requests go to its ClusterIP and Port.
	Service string
	// Port is the Service port (or the port of Address).
	Port int32
	// Address, instead of Service, is an IP to dial directly (a pod, a node).
	Address string
	// Protocol is what the servers speak: HTTP (default), TCP, SMTP, PostgreSQL or MySQL.
	Protocol Protocol
	// PostgreSQL is how the PostgreSQL protocol logs in (nil: postgres, no password).
	PostgreSQL *PostgreSQLLogin
	// MySQL is how the MySQL protocol logs in (nil: root, no password).
	MySQL *MySQLLogin
	// Interval between the starts of two requests (default 10 ms). Requests are sequential,
	// each on a new connection, so kube-proxy chooses an endpoint for every one.
	Interval time.Duration
	// Count stops the loop after this many requests.
	Count int
	// Duration stops the loop after this long: no request starts after it, and the one under
	// way still gets its whole Timeout (a deadline shared with the loop would cut a slow request
	// short at the loop's end and could count it as failed: the demo's one-second chunks saw
	// "dial tcp …:3306: i/o timeout" for a MySQL login that straddled a chunk's end on a loaded
	// machine).
	Duration time.Duration
	// Timeout of one request, connect to reply (default 2 s).
	Timeout time.Duration

	// fromClientIP: IPv4 requests leave from TrafficClientIP (Cluster.Traffic sets it unless
	// Cilium's socket LB, which translates at connect() and keeps no NAT entry, is the dataplane).
	fromClientIP bool
}

// Result is one request of a traffic loop.
type Result struct {
	// Start is when the request started.
	Start time.Time
	// Duration from start to the end of the reply (or the error).
	Duration time.Duration
	// OK: connected, got a reply naming a pod and, for HTTP, status 200.
	OK bool
	// Pod is the "namespace/name" that answered; empty when nobody did.
	Pod string
	// Status is the HTTP status code (0 for other protocols or without a reply).
	Status int
	// Err says why the request failed; empty when OK.
	Err string
}

// Results of a traffic loop, in the order the requests were sent.
type Results []Result

// ByPod counts the successful requests per answering pod.
func (r Results) ByPod() map[string]int {
	m := map[string]int{}
	for _, x := range r {
		if x.OK {
			m[x.Pod]++
		}
	}
	return m
}

// Pods lists the pods that answered successfully, sorted.
func (r Results) Pods() []string {
	var pods []string
	for p := range r.ByPod() {
		pods = append(pods, p)
	}
	sort.Strings(pods)
	return pods
}

// OK counts the successful requests.
func (r Results) OK() int {
	n := 0
	for _, x := range r {
		if x.OK {
			n++
		}
	}
	return n
}

// Failed returns the failed requests.
func (r Results) Failed() Results {
	return keep(r, func(x Result) bool { return !x.OK })
}

// Since returns the requests that started at or after t.
func (r Results) Since(t time.Time) Results {
	return keep(r, func(x Result) bool { return !x.Start.Before(t) })
}

// Before returns the requests that started before t.
func (r Results) Before(t time.Time) Results {
	return keep(r, func(x Result) bool { return x.Start.Before(t) })
}

// keep returns, in order, the elements of xs that ok accepts; nil when none does (the filters
// of Results and HealthChecks).
func keep[S ~[]E, E any](xs S, ok func(E) bool) S {
	var out S
	for _, x := range xs {
		if ok(x) {
			out = append(out, x)
		}
	}
	return out
}

// String summarises the results for failure messages.
func (r Results) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d requests, %d ok, by pod %v", len(r), r.OK(), r.ByPod())
	if f := r.Failed(); len(f) > 0 {
		fmt.Fprintf(&b, ", first failure: %s", f[0].Err)
	}
	return b.String()
}

// Traffic is a running request loop.
type Traffic struct {
	cancel context.CancelFunc
	done   chan struct{}
	// until is when the loop stops starting requests (zero: only Count or Stop end it).
	until time.Time

	mu  sync.Mutex
	res Results
}

// Traffic starts a request loop from the cluster namespace (like a client on a node) to a
// Service's ClusterIP (or Address) in the background. Wait for its results, or Stop it early.
// It stops when the test ends at the latest.
func (c *Cluster) Traffic(t testing.TB, opts TrafficOptions) *Traffic {
	t.Helper()
	target, err := c.trafficTarget(t.Context(), opts)
	if err != nil {
		t.Fatalf("traffic: %v", err)
	}
	if opts.Count <= 0 && opts.Duration <= 0 {
		t.Fatal("traffic: set Count or Duration: the loop must end by itself")
	}
	opts.fromClientIP = !c.ciliumDataplane
	// Not under t.Context(): the loop ends by itself, or at the test's cleanup below.
	tr := startLoop(context.Background(), opts, func(ctx context.Context, tr *Traffic, opts TrafficOptions) { tr.run(ctx, target, opts) })
	t.Cleanup(func() { tr.Stop() })
	return tr
}

// Requests runs a loop to its end and returns its results.
func (c *Cluster) Requests(t testing.TB, opts TrafficOptions) Results {
	t.Helper()
	return c.Traffic(t, opts).Wait()
}

// Wait waits until the loop ends by itself and returns its results.
func (tr *Traffic) Wait() Results {
	<-tr.done
	return tr.Results()
}

// Stop ends the loop now and returns its results.
func (tr *Traffic) Stop() Results {
	tr.cancel()
	return tr.Wait()
}

// Results returns the requests finished so far.
func (tr *Traffic) Results() Results {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append(Results(nil), tr.res...)
}

func (c *Cluster) trafficTarget(ctx context.Context, opts TrafficOptions) (string, error) {
	port := strconv.Itoa(int(opts.Port))
	if opts.Address != "" {
		return net.JoinHostPort(opts.Address, port), nil
	}
	key, err := splitKey(opts.Service)
	if err != nil {
		return "", err
	}
	svc := &corev1.Service{}
	if err := c.Env.Client.Get(ctx, key, svc); err != nil {
		return "", fmt.Errorf("reading Service %s: %w", opts.Service, err)
	}
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return "", fmt.Errorf("service %s has no ClusterIP", opts.Service)
	}
	return net.JoinHostPort(svc.Spec.ClusterIP, port), nil
}

// run is the loop of Cluster.Traffic: every request goes to target.
func (tr *Traffic) run(ctx context.Context, target string, opts TrafficOptions) {
	tr.loop(ctx, opts, func(ctx context.Context, hc *http.Client, res *Result) { send(ctx, hc, target, opts, res) })
}

// loop is the request loop of a Traffic: one request after another (each sent by request, which
// fills in the result), at most one every opts.Interval, until Count requests or ctx ends.
func (tr *Traffic) loop(ctx context.Context, opts TrafficOptions, request func(ctx context.Context, hc *http.Client, res *Result)) {
	defer close(tr.done)
	defer tr.cancel()
	hc := &http.Client{
		Timeout: opts.Timeout,
		Transport: &http.Transport{
			Proxy:             nil,
			DisableKeepAlives: true,
			DialContext:       clientDialer(opts.Timeout, opts.fromClientIP),
		},
	}
	defer hc.CloseIdleConnections()
	for i := 0; opts.Count <= 0 || i < opts.Count; i++ {
		if ctx.Err() != nil || tr.over() {
			return
		}
		start := time.Now()
		res := Result{Start: start}
		request(ctx, hc, &res)
		res.Duration = time.Since(start)
		// A request cut short by Stop (or the caller's ctx) is not a result.
		if !res.OK && ctx.Err() != nil {
			return
		}
		tr.mu.Lock()
		tr.res = append(tr.res, res)
		tr.mu.Unlock()
		if wait := opts.Interval - time.Since(start); wait > 0 {
			if !tr.until.IsZero() {
				wait = min(wait, time.Until(tr.until))
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
	}
}

// loopEnd is when a loop of opts stops starting requests: Duration from now (zero without one).
func loopEnd(opts TrafficOptions) time.Time {
	if opts.Duration <= 0 {
		return time.Time{}
	}
	return time.Now().Add(opts.Duration)
}

// over tells whether the loop's Duration has passed.
func (tr *Traffic) over() bool {
	return !tr.until.IsZero() && !time.Now().Before(tr.until)
}

// send sends one request of opts.Protocol to target and records its answer in res.
func send(ctx context.Context, hc *http.Client, target string, opts TrafficOptions, res *Result) {
	dc := clientDialer(opts.Timeout, opts.fromClientIP)
	switch opts.Protocol {
	case HTTP:
		res.Pod, res.Status, res.OK, res.Err = requestHTTP(ctx, hc, target)
	case TCP:
		res.Pod, res.OK, res.Err = requestTCP(ctx, target, opts.Timeout, dc)
	case SMTP:
		res.Pod, res.OK, res.Err = requestSMTP(ctx, target, opts.Timeout, dc)
	case PostgreSQL:
		res.Pod, res.OK, res.Err = requestPostgreSQL(ctx, target, opts.PostgreSQL, opts.Timeout, dc)
	case MySQL:
		res.Pod, res.OK, res.Err = requestMySQL(ctx, target, opts.MySQL, opts.Timeout, dc)
	default:
		res.Err = fmt.Sprintf("unknown protocol %q", opts.Protocol)
	}
}

func requestHTTP(ctx context.Context, hc *http.Client, target string) (pod string, status int, ok bool, errMsg string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+target+"/", nil)
	if err != nil {
		return "", 0, false, err.Error()
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", 0, false, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return "", resp.StatusCode, false, "reading the reply: " + err.Error()
	}
	pod = strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK {
		return pod, resp.StatusCode, false, "status " + resp.Status
	}
	if pod == "" {
		return "", resp.StatusCode, false, "empty reply"
	}
	return pod, resp.StatusCode, true, ""
}

// DialContext is a net.Dialer's DialContext.
type DialContext func(ctx context.Context, network, address string) (net.Conn, error)

// clientDialer dials like a net.Dialer with the timeout; with fromClientIP, a connection to an
// IPv4 address leaves from the client address of that destination (ClientSource; netns.go says
// why).
func clientDialer(timeout time.Duration, fromClientIP bool) DialContext {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		d := &net.Dialer{Timeout: timeout}
		if fromClientIP {
			if host, _, err := net.SplitHostPort(address); err == nil {
				if ip, err := netip.ParseAddr(host); err == nil && ip.Is4() {
					d.LocalAddr = &net.TCPAddr{IP: ClientSource(ip).AsSlice()}
				}
			}
		}
		return d.DialContext(ctx, network, address)
	}
}

// clientSources gives each IPv4 destination its own source address from the traffic client's
// range, in the order the destinations are first dialled: TrafficClientIP for the first, then
// trafficClientExtra onwards (netns.go says why). Every cluster namespace holds the whole range,
// so one table serves every cluster of the process.
var clientSources = struct {
	sync.Mutex
	byDest map[netip.Addr]netip.Addr
}{byDest: map[netip.Addr]netip.Addr{}}

// ClientSource is the source address of the traffic loops' requests to the IPv4 address dest
// (where the dataplane NATs). Past the range's size, destinations share addresses again (round
// robin), as they all did before.
func ClientSource(dest netip.Addr) netip.Addr {
	clientSources.Lock()
	defer clientSources.Unlock()
	if src, ok := clientSources.byDest[dest]; ok {
		return src
	}
	src := trafficClientAddr(len(clientSources.byDest) % trafficClientAddrs)
	clientSources.byDest[dest] = src
	return src
}

// ClientDialer is the dialer of the cluster's traffic loops, for clients of one's own (the
// demo's gRPC requests): from the cluster namespace's client address where the dataplane
// NATs (clientDialer).
func (c *Cluster) ClientDialer(timeout time.Duration) DialContext {
	return clientDialer(timeout, !c.ciliumDataplane)
}

func dial(ctx context.Context, target string, timeout time.Duration, dc DialContext) (net.Conn, error) {
	c, err := dc(ctx, "tcp", target)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(timeout))
	return c, nil
}

func requestTCP(ctx context.Context, target string, timeout time.Duration, dc DialContext) (pod string, ok bool, errMsg string) {
	c, err := dial(ctx, target, timeout, dc)
	if err != nil {
		return "", false, err.Error()
	}
	defer func() { _ = c.Close() }()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", false, "reading the greeting: " + err.Error()
	}
	pod = strings.TrimSpace(line)
	if pod == "" {
		return "", false, "empty greeting"
	}
	return pod, true, ""
}

func requestSMTP(ctx context.Context, target string, timeout time.Duration, dc DialContext) (pod string, ok bool, errMsg string) {
	c, err := dial(ctx, target, timeout, dc)
	if err != nil {
		return "", false, err.Error()
	}
	defer func() { _ = c.Close() }()
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", false, "reading the greeting: " + err.Error()
	}
	fields := strings.Fields(line)
	if len(fields) < 2 || fields[0] != "220" {
		return "", false, fmt.Sprintf("unexpected greeting %q", line)
	}
	pod = fields[1]
	if _, err := io.WriteString(c, "QUIT\r\n"); err != nil {
		return pod, false, "sending QUIT: " + err.Error()
	}
	line, err = r.ReadString('\n')
	if err != nil {
		return pod, false, "reading the reply to QUIT: " + err.Error()
	}
	if !strings.HasPrefix(line, "221") {
		return pod, false, fmt.Sprintf("unexpected reply to QUIT %q", line)
	}
	return pod, true, ""
}
