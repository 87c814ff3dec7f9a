// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// dataplaneKubeProxy is -dataplane's value for kube-proxy (nftables) in the cluster namespace.
const dataplaneKubeProxy = "kube-proxy"

// dataplaneIdle is how long a sample waits before its flip, so that kube-proxy's minSyncPeriod
// (100 ms in testkit/cluster) since the other side's sample has run out.
const dataplaneIdle = 250 * time.Millisecond

// ruleWatch follows a dataplane's rules for the end of a sample's rules latency: kube-proxy's
// nftables rules (nftWatch) or Cilium's BPF service map (ciliumWatch, cilium.go).
type ruleWatch interface {
	// expect registers, before the flip, what the dataplane must show next for the Service
	// (namespace/name, port 80): addr among the endpoints that get new connections (in) or not.
	expect(ctx context.Context, service string, addr netip.Addr, in bool) (ruleExpectation, error)
	// idle is how long a sample of either side waits before its flip, so that each meets a
	// dataplane free to take in its change (agentSample, kcmSample).
	idle() time.Duration
	stop()
}

// ruleExpectation is one registered expectation.
type ruleExpectation interface {
	// wait returns the moment the dataplane showed the change.
	wait(ctx context.Context, timeout time.Duration) (time.Time, error)
}

// newRuleWatch follows the rules of -dataplane's dataplane.
func newRuleWatch(ctx context.Context, c *cluster.Cluster, dataplane string) (ruleWatch, error) {
	if dataplane == dataplaneCilium {
		w, err := newCiliumWatch(ctx, c)
		if err != nil { // no typed nil in the interface
			return nil, err
		}
		return w, nil
	}
	w, err := newNftWatch(ctx)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// nftWatch follows kube-proxy's nftables rules as they change: `nft monitor new rules` prints
// every rule kube-proxy adds, as it adds it. kube-proxy rewrites a Service port's chain
// (`service-<hash>-<ns>/<name>/tcp/<port>`) with one dispatch rule listing the endpoints that
// get new connections (`dnat ... to <ip>:<port>` for one, `numgen random mod N map { 0 : <ip> .
// <port>, ... }` for several), so the moment that rule is added with (or without) an address is
// the moment the dataplane routes the change: the end of a sample's rules latency. Reading a
// stream, not polling `nft list`, keeps the end exact at 1,000 endpoints (a listing takes tens
// of milliseconds there).
type nftWatch struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	want   map[string]*nftExpectation // by Service, "<namespace>/<name>"
	errs   chan error
	closed chan struct{}
}

type nftExpectation struct {
	w     *nftWatch
	addr  string
	in    bool
	seen  chan time.Time
	where string
}

// ruleChain finds the Service of a dispatch rule: the chain's name after its hash, up to the
// protocol ("add rule ip kube-proxy service-ABCD1234-ns/name/tcp/http ...").
var ruleChain = regexp.MustCompile(`^add rule ip6? kube-proxy service-[A-Z0-9]{8}-([^/ ]+/[^/ ]+)/`)

// ruleTargets are the endpoint addresses of a dispatch rule, in either form (IPv4: the
// benchmark's pods have no other family).
var ruleTargets = regexp.MustCompile(`(?:dnat (?:ip )?to |[0-9]+ : )([0-9]+\.[0-9]+\.[0-9]+\.[0-9]+)`)

// newNftWatch starts `nft monitor` in this network namespace (the cluster's, where kube-proxy
// writes its rules).
func newNftWatch(ctx context.Context) (*nftWatch, error) {
	cmd := exec.CommandContext(ctx, "nft", "monitor", "new", "rules")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting nft monitor: %w", err)
	}
	w := &nftWatch{cmd: cmd, want: map[string]*nftExpectation{}, errs: make(chan error, 1), closed: make(chan struct{})}
	go w.read(bufio.NewScanner(out))
	return w, nil
}

func (w *nftWatch) read(sc *bufio.Scanner) {
	defer close(w.closed)
	sc.Buffer(make([]byte, 0, 1<<16), 16<<20) // a dispatch rule of 1,000 endpoints is ~25 KiB
	for sc.Scan() {
		now := time.Now()
		line := sc.Text()
		m := ruleChain.FindStringSubmatch(line)
		if m == nil || !strings.Contains(line, "dnat") {
			continue
		}
		w.observe(m[1], line, now)
	}
	if err := sc.Err(); err != nil {
		w.errs <- fmt.Errorf("reading nft monitor: %w", err)
	}
}

func (w *nftWatch) observe(service, line string, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.want[service]
	if e == nil {
		return
	}
	in := false
	for _, m := range ruleTargets.FindAllStringSubmatch(line, -1) {
		if m[1] == e.addr {
			in = true
			break
		}
	}
	if in == e.in {
		delete(w.want, service)
		e.seen <- now
	}
}

// expect registers what the next dispatch rule of the Service (namespace/name) must show.
func (w *nftWatch) expect(_ context.Context, service string, addr netip.Addr, in bool) (ruleExpectation, error) {
	e := &nftExpectation{w: w, addr: addr.String(), in: in, seen: make(chan time.Time, 1), where: service}
	w.mu.Lock()
	w.want[service] = e
	w.mu.Unlock()
	return e, nil
}

func (w *nftWatch) idle() time.Duration { return dataplaneIdle }

func (e *nftExpectation) wait(ctx context.Context, timeout time.Duration) (time.Time, error) {
	w := e.w
	select {
	case t := <-e.seen:
		return t, nil
	case err := <-w.errs:
		return time.Time{}, err
	case <-w.closed:
		return time.Time{}, fmt.Errorf("nft monitor ended")
	case <-time.After(timeout):
		return time.Time{}, fmt.Errorf("no rule of %s with %s %s within %s: %w", e.where, e.addr, map[bool]string{true: "in", false: "out"}[e.in], timeout, errTimeout)
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}

func (w *nftWatch) stop() {
	if w.cmd.Process != nil {
		_ = w.cmd.Process.Kill()
	}
	_ = w.cmd.Wait()
}

// waitRouted polls the dataplane's rules (cluster.ProgrammedEndpoints: kube-proxy's, or
// Cilium's service map) until the Service's port 80 sends new connections to n
// endpoints (the start of a size, before any flip).
func (b *bench) waitRouted(ctx context.Context, service string, n int) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		eps, err := b.c.ProgrammedEndpoints(ctx, service, 80)
		if err == nil && len(eps) == n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the dataplane routes %s to %d endpoints, not %d, after 5 minutes (%v)", service, len(eps), n, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
