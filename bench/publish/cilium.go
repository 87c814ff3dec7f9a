// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// dataplaneCilium is -dataplane's value for Cilium: cilium-agent v1.20.2 (tools/cilium) as
// kube-proxy replacement in the cluster namespace (testkit/cluster, Options.Cilium).
const dataplaneCilium = "cilium"

// ciliumPoll is how often a sample reads the Service's master entry: a sample's end is late by
// at most this much (half of it on average). One read is one bpf(2) lookup, about a
// microsecond.
const ciliumPoll = time.Millisecond

// ciliumTick is how often cilium-agent hands the Service and EndpointSlice events it buffered
// to its load-balancing tables: --lb-reflector-wait-time, 500 ms by default in v1.20.2
// (pkg/loadbalancer/config.go; the Helm chart's loadBalancer.reflectorWaitTime, which
// testkit/cluster leaves alone), the period of a free-running ticker (github.com/cilium/stream
// v0.0.1's Buffer), not reset by activity. A change waits 0 to 500 ms for it whatever the load.
const ciliumTick = 500 * time.Millisecond

// ciliumPollLimit ends a poller whose sample failed before waiting for it.
const ciliumPollLimit = 5 * time.Minute

// Cilium's IPv4 load balancer maps, pinned under its bpffs's tc/globals. The layouts are
// v1.20.2's pkg/loadbalancer/maps (types.go: Service4Key, Service4Value, Backend4ValueV3, after
// bpf/lib/common.h's lb4_key, lb4_service, lb4_backend); newCiliumWatch checks the sizes
// against the maps'.
const (
	ciliumServicesMap = "cilium_lb4_services_v2"
	ciliumBackendsMap = "cilium_lb4_backends_v3"
)

// lb4Key is a services map key. Slot 0 is a frontend's master entry; slots 1.. name its
// backends.
type lb4Key struct {
	Address     [4]byte
	Port        [2]byte // network byte order
	BackendSlot uint16
	Proto       uint8 // IPPROTO_TCP for a TCP Service port since v1.17 (before: 0, any)
	Scope       uint8 // 0: external (a ClusterIP's only entry without a Local traffic policy)
	Pad         [2]byte
}

// lb4Service is a services map value. In the master entry Count is the number of backends that
// get new connections (slots 1..Count: the active ones, or the terminating ones when none is
// active) and QCount the slots after them kept for established flows; in a slot BackendID names
// the backend. The reconciler (pkg/loadbalancer/reconciler, updateFrontend) writes the slots
// first and the master entry last, so the datapath sees a new set when Count changes.
type lb4Service struct {
	BackendID uint32
	Count     uint16
	RevNat    uint16 // network byte order
	Flags     uint8
	Flags2    uint8
	QCount    uint16
}

// lb4Backend is a backends map value (its key is the backend ID, a uint32).
type lb4Backend struct {
	Address   [4]byte
	Port      [2]byte // network byte order
	Proto     uint8
	Flags     uint8
	ClusterID uint16
	Zone      uint8
	Pad       uint8
}

// ciliumWatch reads Cilium's BPF service map, the table its datapath (the socket load balancer
// and bpf_host) picks a backend from, with github.com/cilium/ebpf, the library Cilium itself
// reads and writes its maps with. An endpoint that turns not ready leaves the slots (Cilium
// reads F F F as maintenance: no slot) and one that turns ready gets one, so a sample's end is
// the first read at which the master entry of ClusterIP:80/TCP counts one backend fewer (or
// more) than before the flip. The set of backends is checked once after that, untimed: reading
// 1,000 slots and backends takes milliseconds, too slow to poll.
type ciliumWatch struct {
	c                  *cluster.Cluster
	services, backends *ebpf.Map
	ctx                context.Context
	cancel             context.CancelFunc
	mu                 sync.Mutex
	clusterIPs         map[string]netip.Addr // by Service, "<namespace>/<name>"
}

type ciliumExpectation struct {
	w     *ciliumWatch
	key   lb4Key
	addr  netip.Addr
	in    bool
	want  int
	where string
	seen  chan time.Time
	errs  chan error
	done  context.CancelFunc
}

// newCiliumWatch opens the cluster's cilium-agent's service and backends maps (read-only).
func newCiliumWatch(ctx context.Context, c *cluster.Cluster) (*ciliumWatch, error) {
	bpffs, err := c.CiliumBPFFS()
	if err != nil {
		return nil, err
	}
	open := func(name string, key, value any) (*ebpf.Map, error) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, "tc", "globals", name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil, fmt.Errorf("opening cilium-agent's map %s: %w", name, err)
		}
		if k, v := binary.Size(key), binary.Size(value); int(m.KeySize()) != k || int(m.ValueSize()) != v {
			_ = m.Close()
			return nil, fmt.Errorf("cilium-agent's map %s has %d-byte keys and %d-byte values, not %d and %d: another layout than v1.20.2's",
				name, m.KeySize(), m.ValueSize(), k, v)
		}
		return m, nil
	}
	w := &ciliumWatch{c: c, clusterIPs: map[string]netip.Addr{}}
	if w.services, err = open(ciliumServicesMap, lb4Key{}, lb4Service{}); err != nil {
		return nil, err
	}
	if w.backends, err = open(ciliumBackendsMap, uint32(0), lb4Backend{}); err != nil {
		_ = w.services.Close()
		return nil, err
	}
	w.ctx, w.cancel = context.WithCancel(ctx)
	return w, nil
}

// expect reads the Service's current count and starts polling for the one after the flip.
func (w *ciliumWatch) expect(ctx context.Context, service string, addr netip.Addr, in bool) (ruleExpectation, error) {
	ip, err := w.clusterIP(ctx, service)
	if err != nil {
		return nil, err
	}
	key := lb4Key{Address: ip.As4(), Proto: 6}
	binary.BigEndian.PutUint16(key.Port[:], 80)
	count, err := w.count(key)
	if err != nil {
		return nil, err
	}
	e := &ciliumExpectation{w: w, key: key, addr: addr, in: in, want: count - 1, where: service,
		seen: make(chan time.Time, 1), errs: make(chan error, 1)}
	if in {
		e.want = count + 1
	}
	pollCtx, cancel := context.WithTimeout(w.ctx, ciliumPollLimit)
	e.done = cancel
	go e.poll(pollCtx)
	return e, nil
}

// idle gives the built-in side a random phase against Cilium's tick: its start would otherwise
// come a fixed time after the tick that ended the agent's sample (the agent's decisive probes
// are jittered, so theirs is random already).
func (w *ciliumWatch) idle() time.Duration { return dataplaneIdle + rand.N(ciliumTick) }

func (w *ciliumWatch) stop() {
	w.cancel()
	_ = w.services.Close()
	_ = w.backends.Close()
}

// clusterIP is the Service's ClusterIP, read once.
func (w *ciliumWatch) clusterIP(ctx context.Context, service string) (netip.Addr, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ip, ok := w.clusterIPs[service]; ok {
		return ip, nil
	}
	ns, name, ok := strings.Cut(service, "/")
	if !ok {
		return netip.Addr{}, fmt.Errorf("service %q is not namespace/name", service)
	}
	svc := &corev1.Service{}
	if err := w.c.Env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, svc); err != nil {
		return netip.Addr{}, fmt.Errorf("reading Service %s: %w", service, err)
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil || !ip.Is4() {
		return netip.Addr{}, fmt.Errorf("service %s has no IPv4 ClusterIP (%q)", service, svc.Spec.ClusterIP)
	}
	w.clusterIPs[service] = ip
	return ip, nil
}

// count is the master entry's Count (0 when there is none).
func (w *ciliumWatch) count(key lb4Key) (int, error) {
	var v lb4Service
	key.BackendSlot = 0
	if err := w.services.Lookup(&key, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return 0, nil
		}
		return 0, fmt.Errorf("reading %s: %w", ciliumServicesMap, err)
	}
	return int(v.Count), nil
}

// has reports whether addr is one of the backends in slots 1..count.
func (w *ciliumWatch) has(key lb4Key, count int, addr netip.Addr) (bool, error) {
	want := addr.As4()
	for slot := 1; slot <= count; slot++ {
		key.BackendSlot = uint16(slot)
		var s lb4Service
		if err := w.services.Lookup(&key, &s); err != nil {
			return false, fmt.Errorf("reading slot %d of %s: %w", slot, ciliumServicesMap, err)
		}
		var b lb4Backend
		if err := w.backends.Lookup(s.BackendID, &b); err != nil {
			return false, fmt.Errorf("reading backend %d of %s: %w", s.BackendID, ciliumBackendsMap, err)
		}
		if b.Address == want {
			return true, nil
		}
	}
	return false, nil
}

func (e *ciliumExpectation) poll(ctx context.Context) {
	t := time.NewTicker(ciliumPoll)
	defer t.Stop()
	for {
		n, err := e.w.count(e.key)
		now := time.Now()
		if err != nil {
			e.errs <- err
			return
		}
		if n == e.want {
			e.seen <- now
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (e *ciliumExpectation) wait(ctx context.Context, timeout time.Duration) (time.Time, error) {
	defer e.done()
	dir := map[bool]string{true: "in", false: "out"}[e.in]
	select {
	case t := <-e.seen:
		in, err := e.w.has(e.key, e.want, e.addr)
		if err != nil {
			return time.Time{}, err
		}
		if in != e.in {
			return time.Time{}, fmt.Errorf("cilium's service map of %s counts %d backends, but %s is not %s them", e.where, e.want, e.addr, dir)
		}
		return t, nil
	case err := <-e.errs:
		return time.Time{}, err
	case <-time.After(timeout):
		n, err := e.w.count(e.key)
		return time.Time{}, fmt.Errorf("cilium's service map of %s still counts %d backends (%v), not %d with %s %s, after %s: %w",
			e.where, n, err, e.want, e.addr, dir, timeout, errTimeout)
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}
