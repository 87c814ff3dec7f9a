// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// BulkSpec describes many pods that share one network namespace: for tests and benchmarks that
// need hundreds or thousands of pod addresses (one network namespace per pod costs about
// 130 ms; a bulk of 1 000 pods takes seconds, mostly the API writes).
type BulkSpec struct {
	// Namespace of the Pod objects.
	Namespace string
	// NamePrefix names the pods <NamePrefix>-<i>, i from 0; default "bulk".
	NamePrefix string
	// Node is the name of one of the cluster's nodes; empty means the first.
	Node string
	// Count is the number of pods.
	Count int
	// Port, when set, gets one HTTP server that listens on every pod address of the bulk; its
	// status is set per pod (SetHealthy): 200 for a healthy pod (the default), 503 otherwise.
	Port int
	// Labels of every Pod object.
	Labels map[string]string
	// ContainerPorts of every pod's one container ("app").
	ContainerPorts []corev1.ContainerPort
	// NotReady starts the pods with Ready=False (the zero value is ready, running pods).
	NotReady bool
}

// BulkPods are pods that share one network namespace: every pod has its own address (a /32 on
// the namespace's eth0, a host route in the cluster namespace) and its own Pod object, and one
// HTTP server answers on all of them. Each Pods[i] is a *Pod for the object side (IP, Key,
// Endpoint, SetReady, MarkTerminating, Delete deletes the object only) but has no namespace of
// its own: ServeHTTP and friends, InNetns and Command do not work on it; use the bulk's.
type BulkPods struct {
	// Pods in index order; Pods[i] is named <NamePrefix>-<i>.
	Pods []*Pod
	// Netns is the shared network namespace (`ip -n`).
	Netns string
	// HostLink is the cluster-side end of the namespace's veth pair.
	HostLink string
	// Port is the HTTP server's port (0: no server).
	Port int

	c         *Cluster
	byAddr    map[netip.Addr]int
	unhealthy []atomic.Bool // the zero value is healthy
	hits      []atomic.Int64
	srv       *http.Server
	srvDone   chan struct{}

	removeMu sync.Mutex
	removed  bool
}

// AddBulkPods creates the pods and removes them when the test ends. Order, as for AddPod: the
// network namespace, every address and route and the HTTP server exist before the first Pod
// object names an address.
func (c *Cluster) AddBulkPods(t testing.TB, spec BulkSpec) *BulkPods {
	t.Helper()
	b, err := c.NewBulkPods(t.Context(), spec)
	if err != nil {
		t.Fatalf("adding %d bulk pods in %s: %v", spec.Count, spec.Namespace, err)
	}
	t.Cleanup(func() {
		if err := b.Remove(context.Background()); err != nil {
			t.Errorf("removing bulk pods %s: %v", b.Netns, err)
		}
	})
	return b
}

// NewBulkPods is AddBulkPods without a test: the caller removes the pods with Remove.
// Cluster.Stop deletes the Pod objects of a bulk left behind, not its namespace.
func (c *Cluster) NewBulkPods(ctx context.Context, spec BulkSpec) (b *BulkPods, err error) {
	if spec.Count < 1 {
		return nil, fmt.Errorf("bulk pods: Count %d, want at least 1", spec.Count)
	}
	if c.nodeNets != nil {
		return nil, errors.New("bulk pods: not supported on a cluster with Options.NodeKubeProxies")
	}
	if spec.NamePrefix == "" {
		spec.NamePrefix = "bulk"
	}
	if spec.Node == "" {
		spec.Node = c.Nodes[0].Name
	}
	var node *NodeInfo
	for i := range c.Nodes {
		if c.Nodes[i].Name == spec.Node {
			node = &c.Nodes[i]
		}
	}
	if node == nil {
		return nil, fmt.Errorf("no node %q in the cluster", spec.Node)
	}
	b = &BulkPods{
		Port: spec.Port, c: c, byAddr: make(map[netip.Addr]int, spec.Count),
		unhealthy: make([]atomic.Bool, spec.Count), hits: make([]atomic.Int64, spec.Count),
	}
	for i := range spec.Count {
		podIP, err := alloc.podIP()
		if err != nil {
			return nil, err
		}
		b.Pods = append(b.Pods, &Pod{
			Namespace: spec.Namespace, Name: spec.NamePrefix + "-" + strconv.Itoa(i), Node: spec.Node, IP: podIP, IPs: []netip.Addr{podIP},
			c: c, zone: node.Zone, servers: map[*Server]struct{}{},
		})
		b.byAddr[podIP] = i
	}
	defer func() {
		if err != nil {
			if rerr := b.Remove(context.Background()); rerr != nil {
				err = fmt.Errorf("%w (and cleaning up: %w)", err, rerr)
			}
		}
	}()
	if err := b.createNetwork(); err != nil {
		return b, err
	}
	if spec.Port != 0 {
		if err := b.serve(); err != nil {
			return b, err
		}
	}
	c.mu.Lock()
	for _, p := range b.Pods {
		c.pods[p] = struct{}{}
	}
	c.mu.Unlock()
	podSpec := PodSpec{Namespace: spec.Namespace, Node: spec.Node, Labels: spec.Labels, ContainerPorts: spec.ContainerPorts, NotReady: spec.NotReady}
	if err := b.each(ctx, func(ctx context.Context, p *Pod) error {
		s := podSpec
		s.Name = p.Name
		return p.createObject(ctx, s, node)
	}); err != nil {
		return b, err
	}
	return b, nil
}

// createNetwork makes the namespace, a veth pair ("eth0" inside), every address on eth0 and the
// routes: inside, default via the cluster namespace's address; in the cluster namespace, a
// /32 route per pod address via the first one, so the neighbour table holds one entry for the
// whole bulk (its size is shared by every namespace of the machine).
func (b *BulkPods) createNetwork() error {
	n := alloc.next()
	netns := namePrefix() + "b" + strconv.Itoa(n)
	link := "swhb" + strconv.Itoa(n)
	if err := ip("netns", "add", netns); err != nil {
		return err
	}
	b.Netns = netns
	if err := ipBatch("", []string{"link add " + link + " type veth peer name eth0 netns " + netns}); err != nil {
		return err
	}
	b.HostLink = link
	inside := []string{"link set lo up"}
	for _, p := range b.Pods {
		inside = append(inside, "addr add "+p.IP.String()+"/32 dev eth0")
	}
	inside = append(inside,
		"link set eth0 up",
		"route add "+gatewayIP+"/32 dev eth0 scope link",
		"route add default via "+gatewayIP+" dev eth0",
	)
	if err := ipBatch(netns, inside); err != nil {
		return err
	}
	first := b.Pods[0].IP.String()
	outside := []string{"link set " + link + " up", "route add " + first + "/32 dev " + link}
	for _, p := range b.Pods[1:] {
		outside = append(outside, "route add "+p.IP.String()+"/32 via "+first+" dev "+link)
	}
	return ipBatch("", outside)
}

// serve starts the HTTP server on Port on every address of the namespace.
func (b *BulkPods) serve() error {
	var ln net.Listener
	err := inNetns(b.NetnsPath(), func() error {
		var err error
		ln, err = net.Listen("tcp4", ":"+strconv.Itoa(b.Port))
		return err
	})
	if err != nil {
		return fmt.Errorf("bulk pods %s: listening on port %d: %w", b.Netns, b.Port, err)
	}
	b.srv = &http.Server{Handler: http.HandlerFunc(b.serveHTTP), ReadHeaderTimeout: 10 * time.Second}
	b.srvDone = make(chan struct{})
	srv, done := b.srv, b.srvDone
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	return nil
}

func (b *BulkPods) serveHTTP(w http.ResponseWriter, r *http.Request) {
	local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	ap, err := netip.ParseAddrPort(fmt.Sprint(local))
	i, ok := b.byAddr[ap.Addr().Unmap()]
	if err != nil || !ok {
		http.Error(w, "no pod has address "+fmt.Sprint(local), http.StatusMisdirectedRequest)
		return
	}
	b.hits[i].Add(1)
	p := b.Pods[i]
	w.Header().Set("X-Pod", p.Key())
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if b.unhealthy[i].Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
	} else {
		w.WriteHeader(http.StatusOK)
	}
	_, _ = fmt.Fprintf(w, "%s\n", p.Key())
}

// Len is the number of pods.
func (b *BulkPods) Len() int { return len(b.Pods) }

// NetnsPath is the path of the shared network namespace.
func (b *BulkPods) NetnsPath() string { return netnsDir + "/" + b.Netns }

// InNetns runs fn on an OS thread inside the shared network namespace (see Pod.InNetns).
func (b *BulkPods) InNetns(fn func() error) error { return inNetns(b.NetnsPath(), fn) }

// SetHealthy makes the HTTP server answer pod i's address with 200 (healthy) or 503.
func (b *BulkPods) SetHealthy(i int, healthy bool) { b.unhealthy[i].Store(!healthy) }

// Healthy reports what SetHealthy last set for pod i (true at start).
func (b *BulkPods) Healthy(i int) bool { return !b.unhealthy[i].Load() }

// Hits counts the HTTP requests pod i's address has answered.
func (b *BulkPods) Hits(i int) int64 { return b.hits[i].Load() }

// Index is the index of the pod with address addr, or -1.
func (b *BulkPods) Index(addr netip.Addr) int {
	if i, ok := b.byAddr[addr]; ok {
		return i
	}
	return -1
}

// Remove deletes every Pod object and waits until they are gone, then stops the server and
// removes the namespace and its links (the addresses outlive the objects). Idempotent.
func (b *BulkPods) Remove(ctx context.Context) error {
	b.removeMu.Lock()
	defer b.removeMu.Unlock()
	if b.removed {
		return nil
	}
	var errs []error
	if b.c.Env != nil {
		if err := b.each(ctx, func(ctx context.Context, p *Pod) error { return p.remove(ctx) }); err != nil {
			errs = append(errs, err)
		}
	}
	if b.srv != nil {
		_ = b.srv.Close()
		<-b.srvDone
		b.srv = nil
	}
	if b.HostLink != "" {
		if err := ip("link", "del", b.HostLink); err != nil && !isNoDevice(err) {
			errs = append(errs, err)
		}
	}
	if b.Netns != "" {
		if err := ip("netns", "del", b.Netns); err != nil && !strings.Contains(err.Error(), "No such file") {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		b.removed = true
	}
	return errors.Join(errs...)
}

// each runs fn for every pod with a bounded number of API calls in flight.
func (b *BulkPods) each(ctx context.Context, fn func(context.Context, *Pod) error) error {
	const parallel = 16
	work := make(chan *Pod)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range parallel {
		wg.Go(func() {
			for p := range work {
				if err := fn(ctx, p); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for _, p := range b.Pods {
		work <- p
	}
	close(work)
	wg.Wait()
	if len(errs) > 3 {
		errs = append(errs[:3], fmt.Errorf("and %d more errors", len(errs)-3))
	}
	return errors.Join(errs...)
}
