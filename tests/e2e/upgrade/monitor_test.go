// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package upgrade_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// watchAll lists the objects of a namespace and watches them from that list, listing again
// whenever the watch ends (the API server ends the watches of a custom resource when its CRD
// changes) until ctx ends. onList gets every list, onEvent every change after it.
func watchAll(ctx context.Context, wc client.WithWatch, ns string, newList func() client.ObjectList,
	onList func([]runtime.Object), onEvent func(watch.Event), onErr func(error),
) {
	for ctx.Err() == nil {
		list := newList()
		if err := wc.List(ctx, list, client.InNamespace(ns)); err != nil {
			if ctx.Err() == nil {
				onErr(fmt.Errorf("listing: %w", err))
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
			continue
		}
		items, err := itemsOf(list)
		if err != nil {
			onErr(err)
			return
		}
		onList(items)
		rv := list.(metav1.ListInterface).GetResourceVersion()
		w, err := wc.Watch(ctx, newList(), client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		if err != nil {
			continue
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				break
			}
			if ev.Type != watch.Bookmark {
				onEvent(ev)
			}
		}
		w.Stop()
	}
}

// itemsOf is a list's items.
func itemsOf(list client.ObjectList) ([]runtime.Object, error) {
	switch l := list.(type) {
	case *discoveryv1.EndpointSliceList:
		out := make([]runtime.Object, 0, len(l.Items))
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
		return out, nil
	case *unstructured.UnstructuredList:
		out := make([]runtime.Object, 0, len(l.Items))
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected list %T", list)
}

// publishedSlice is what the monitor keeps of one of the module's slices.
type publishedSlice struct {
	// key is the slice's identity apart from its name: resource, port, node, address type.
	key       string
	port      string // "<resource>/<port>"
	node      string
	endpoints map[string]string
	// chunk is the chunk the name carries (slicemeta.ChunkOf): 0 for the common name
	// <resource>-<port>-<node> (the only one of releases before chunks), k for
	// <resource>-<port>---<k>-<node>.
	chunk int
}

// endpointMove is an endpoint that left a slice while other slices of the same resource, port,
// node and family already listed it: the only way an endpoint may leave a slice after Hold.
type endpointMove struct {
	At         time.Time
	Port, Node string
	Address    string
	From       string
	// FromChunk is the chunk of From; ToChunks are those of To, in the same order.
	FromChunk int
	To        []string
	ToChunks  []int
	// Deleted tells whether From was deleted (else it was updated without the endpoint).
	Deleted bool
}

// intoChunk tells whether the move took the endpoint from the common-name slice into a chunk.
func (mv endpointMove) intoChunk() bool {
	return mv.FromChunk == 0 && slices.ContainsFunc(mv.ToChunks, func(c int) bool { return c > 0 })
}

// outOfChunk tells whether the move took the endpoint from a chunk into the common-name slice.
func (mv endpointMove) outOfChunk() bool {
	return mv.FromChunk > 0 && slices.Contains(mv.ToChunks, 0)
}

func (mv endpointMove) String() string {
	how := "updated without it"
	if mv.Deleted {
		how = "deleted"
	}
	return fmt.Sprintf("%s %s %s: %s (chunk %d, %s) -> already in %v (chunks %v)",
		mv.At.Format("15:04:05.000"), mv.Port, mv.Address, mv.From, mv.FromChunk, how, mv.To, mv.ToChunks)
}

// sliceMonitor follows the module's slices of a namespace and checks at every change that
// every port keeps the endpoints it must keep ready, that an endpoint leaves a slice only when
// another slice of the same resource, port, node and family already lists it (a move: into a
// chunk, out of one, or to a renamed slice), and that a slice goes only once a slice with the
// same resource, port, node and address type (its successor under another name, or the slice
// its endpoints moved to) exists. The watch delivers the changes in the order the API server
// made them, so "already lists it" is the state at the change that dropped the endpoint.
type sliceMonitor struct {
	mu     sync.Mutex
	slices map[string]publishedSlice
	// keepReady are the addresses each port ("<resource>/<port>") must list ready throughout.
	keepReady  map[string][]string
	violations []string
	renames    []string
	moves      []endpointMove
	// lists counts the lists taken: after the first (the watch ended) the changes between two
	// lists are judged against the second list's state, not one by one.
	lists int
	// changes are the events seen, "15:04:05.000 MODIFIED web-node-a map[10.0.0.2:TTF]".
	changes []string
}

func describeSlice(s *discoveryv1.EndpointSlice) publishedSlice {
	res := slicemeta.ResourceOf(s)
	port, _ := slicemeta.PortOf(s)
	node := slicemeta.NodeOf(s)
	return publishedSlice{
		key:       strings.Join([]string{res, port, node, string(s.AddressType)}, "|"),
		port:      res + "/" + port,
		node:      node,
		endpoints: e2e.SliceEndpoints(s),
		chunk:     slicemeta.ChunkOf(s.Name, res, port),
	}
}

// watchSlices starts a sliceMonitor; keepReady is filled in by Hold once the start state is
// published. It stops when the test ends.
func watchSlices(t *testing.T, c *cluster.Cluster, ns string) *sliceMonitor {
	t.Helper()
	wc, err := client.NewWithWatch(c.Env.Config, client.Options{Scheme: c.Env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	m := &sliceMonitor{slices: map[string]publishedSlice{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchAll(ctx, wc, ns, func() client.ObjectList { return &discoveryv1.EndpointSliceList{} },
			m.onList, m.onEvent, func(err error) { m.violate("slice watch: %v", err) })
	}()
	t.Cleanup(func() { cancel(); <-done })
	return m
}

func (m *sliceMonitor) violate(format string, args ...any) {
	m.violations = append(m.violations, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
}

// onList takes a fresh list: slices missing from it were deleted meanwhile, endpoints missing
// from a slice were dropped meanwhile (judged against the list's state).
func (m *sliceMonitor) onList(items []runtime.Object) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lists++
	prev := m.slices
	m.slices = map[string]publishedSlice{}
	for _, o := range items {
		s := o.(*discoveryv1.EndpointSlice)
		if slicemeta.IsManaged(s) {
			m.slices[s.Name] = describeSlice(s)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(prev)) {
		if now, ok := m.slices[name]; ok {
			m.dropped(name, prev[name], now.endpoints, false)
		} else {
			m.gone(name, prev[name])
		}
	}
	m.check()
}

func (m *sliceMonitor) onEvent(ev watch.Event) {
	s, ok := ev.Object.(*discoveryv1.EndpointSlice)
	if !ok || !slicemeta.IsManaged(s) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.changes = append(m.changes, fmt.Sprintf("%s %s %s %v", time.Now().Format("15:04:05.000"), ev.Type, s.Name, e2e.SliceEndpoints(s)))
	if ev.Type == watch.Deleted {
		m.deleted(s.Name)
	} else {
		was, existed := m.slices[s.Name]
		m.slices[s.Name] = describeSlice(s)
		if existed {
			m.dropped(s.Name, was, m.slices[s.Name].endpoints, false)
		}
	}
	m.check()
}

// dropped judges the endpoints slice name listed (was) and lists no more (now; nil when it was
// deleted): each must be listed already by another slice of the same resource, port, node and
// family, else it left the Service (for a moment at least). m.slices holds the state after the
// change.
func (m *sliceMonitor) dropped(name string, was publishedSlice, now map[string]string, deleted bool) {
	if m.keepReady == nil {
		return
	}
	for _, addr := range slices.Sorted(maps.Keys(was.endpoints)) {
		if _, still := now[addr]; still {
			continue
		}
		mv := endpointMove{At: time.Now(), Port: was.port, Node: was.node, Address: addr, From: name, FromChunk: was.chunk, Deleted: deleted}
		for _, other := range slices.Sorted(maps.Keys(m.slices)) {
			s := m.slices[other]
			if other == name || s.key != was.key {
				continue
			}
			if _, ok := s.endpoints[addr]; ok {
				mv.To = append(mv.To, other)
				mv.ToChunks = append(mv.ToChunks, s.chunk)
			}
		}
		if len(mv.To) == 0 {
			m.violate("port %s: endpoint %s left slice %s (chunk %d, deleted %t) while no other slice of its resource, port, node and family listed it (slices: %v)",
				was.port, addr, name, was.chunk, deleted, m.slicesOf(was.port))
			continue
		}
		m.moves = append(m.moves, mv)
	}
}

// deleted removes a slice and judges its going (gone).
func (m *sliceMonitor) deleted(name string) {
	was, ok := m.slices[name]
	if !ok {
		return
	}
	delete(m.slices, name)
	m.gone(name, was)
}

// gone judges a slice deleted (no longer in m.slices): its endpoints must be listed elsewhere
// (dropped) and its successor must exist.
func (m *sliceMonitor) gone(name string, was publishedSlice) {
	if m.keepReady == nil {
		return
	}
	m.dropped(name, was, nil, true)
	for _, other := range slices.Sorted(maps.Keys(m.slices)) {
		if m.slices[other].key == was.key {
			m.renames = append(m.renames, name+" -> "+other)
			return
		}
	}
	m.violate("slice %s (%s) was deleted while no other slice published its resource, port, node and family", name, was.key)
}

// check asserts that every port lists its kept addresses ready.
func (m *sliceMonitor) check() {
	for port, addrs := range m.keepReady {
		ready := m.readyOf(port)
		for _, a := range addrs {
			if !ready[a] {
				m.violate("port %s: %s is not published ready (slices: %v)", port, a, m.slicesOf(port))
			}
		}
	}
}

func (m *sliceMonitor) readyOf(port string) map[string]bool {
	ready := map[string]bool{}
	for _, s := range m.slices {
		if s.port != port {
			continue
		}
		for a, conds := range s.endpoints {
			if strings.HasPrefix(conds, "T") {
				ready[a] = true
			}
		}
	}
	return ready
}

func (m *sliceMonitor) slicesOf(port string) map[string]map[string]string {
	out := map[string]map[string]string{}
	for name, s := range m.slices {
		if s.port == port {
			out[name] = s.endpoints
		}
	}
	return out
}

// Hold makes the ports' currently ready addresses the ones every later state must keep ready,
// and returns them; it returns an error when a port has none ready.
func (m *sliceMonitor) Hold(ports []string) (map[string][]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	keep := map[string][]string{}
	for _, p := range ports {
		for a := range m.readyOf(p) {
			keep[p] = append(keep[p], a)
		}
		if len(keep[p]) == 0 {
			return nil, fmt.Errorf("port %s has no ready endpoint", p)
		}
		sort.Strings(keep[p])
	}
	m.keepReady = keep
	return keep, nil
}

// Names are the slices' names now, sorted.
func (m *sliceMonitor) Names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for n := range m.slices {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Report is the violations, the renames and the changes seen.
func (m *sliceMonitor) Report() (violations, renames, changes []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.violations), slices.Clone(m.renames), slices.Clone(m.changes)
}

// Moves are the endpoint moves seen since Hold, in order.
func (m *sliceMonitor) Moves() []endpointMove {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.moves)
}

// Relists is how many times the watch ended and the slices were listed again.
func (m *sliceMonitor) Relists() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return max(0, m.lists-1)
}

// Endpoints are the endpoints of every slice now, by slice name (address -> conditions).
func (m *sliceMonitor) Endpoints() map[string]map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]map[string]string, len(m.slices))
	for name, s := range m.slices {
		out[name] = maps.Clone(s.endpoints)
	}
	return out
}

// resourceStatus is what the status monitor holds every resource to.
type resourceStatus struct {
	ClusterIP string
	// Ready is the ready endpoints per port name.
	Ready map[string]int64
}

// statusMonitor follows the namespace's ServiceWithHealthchecks and checks every version it
// sees against the status each had when Hold was called: the same clusterIP, at least as many
// ready endpoints per port, ServiceSynced and EndpointsAvailable True.
type statusMonitor struct {
	mu         sync.Mutex
	current    map[string]*unstructured.Unstructured
	held       map[string]resourceStatus
	violations []string
	seen       int
}

// resourceListGVK is the ServiceWithHealthchecks list kind, read unstructured: whatever
// version of the CRD is served.
var resourceListGVK = schema.GroupVersionKind{Group: wellknown.Group, Version: "v1alpha1", Kind: wellknown.Kind + "List"}

func watchStatuses(t *testing.T, c *cluster.Cluster, ns string) *statusMonitor {
	t.Helper()
	wc, err := client.NewWithWatch(c.Env.Config, client.Options{Scheme: c.Env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	m := &statusMonitor{current: map[string]*unstructured.Unstructured{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	newList := func() client.ObjectList {
		l := &unstructured.UnstructuredList{}
		l.SetGroupVersionKind(resourceListGVK)
		return l
	}
	go func() {
		defer close(done)
		watchAll(ctx, wc, ns, newList, func(items []runtime.Object) {
			for _, o := range items {
				m.observe(o.(*unstructured.Unstructured))
			}
		}, func(ev watch.Event) {
			if u, ok := ev.Object.(*unstructured.Unstructured); ok && ev.Type != watch.Deleted {
				m.observe(u)
			}
		}, func(error) {})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return m
}

// statusOf reads the held part of a resource's status, and whether its conditions say synced
// and available.
func statusOf(u *unstructured.Unstructured) (resourceStatus, []string) {
	st := resourceStatus{Ready: map[string]int64{}}
	st.ClusterIP, _, _ = unstructured.NestedString(u.Object, "status", "clusterIP")
	ports, _, _ := unstructured.NestedSlice(u.Object, "status", "ports")
	for _, p := range ports {
		pm, _ := p.(map[string]any)
		name, _ := pm["name"].(string)
		st.Ready[name], _ = toInt64(pm["readyEndpoints"])
	}
	var notTrue []string
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	want := map[string]bool{"ServiceSynced": false, "EndpointsAvailable": false}
	for _, c := range conds {
		cm, _ := c.(map[string]any)
		if typ, _ := cm["type"].(string); typ != "" {
			if _, ok := want[typ]; ok {
				want[typ] = cm["status"] == "True"
			}
		}
	}
	for typ, ok := range want {
		if !ok {
			notTrue = append(notTrue, typ)
		}
	}
	sort.Strings(notTrue)
	return st, notTrue
}

func toInt64(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case float64:
		return int64(n), true
	case int:
		return int64(n), true
	}
	return 0, false
}

func (m *statusMonitor) observe(u *unstructured.Unstructured) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seen++
	m.current[u.GetName()] = u.DeepCopy()
	want, ok := m.held[u.GetName()]
	if !ok {
		return
	}
	got, notTrue := statusOf(u)
	at := time.Now().Format("15:04:05.000 ")
	if got.ClusterIP != want.ClusterIP {
		m.violations = append(m.violations, fmt.Sprintf("%s%s: status.clusterIP %q, was %q", at, u.GetName(), got.ClusterIP, want.ClusterIP))
	}
	for port, n := range want.Ready {
		if got.Ready[port] < n {
			m.violations = append(m.violations, fmt.Sprintf("%s%s: port %q has %d ready endpoints in its status, was %d", at, u.GetName(), port, got.Ready[port], n))
		}
	}
	if len(notTrue) > 0 {
		m.violations = append(m.violations, fmt.Sprintf("%s%s: conditions %v not True", at, u.GetName(), notTrue))
	}
}

// Hold makes the resources' statuses now the ones every later version must keep; it fails when
// a resource has no clusterIP, no port status or a condition that is not True.
func (m *statusMonitor) Hold(names []string) (map[string]resourceStatus, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	held := map[string]resourceStatus{}
	for _, n := range names {
		u, ok := m.current[n]
		if !ok {
			return nil, fmt.Errorf("resource %s not seen", n)
		}
		st, notTrue := statusOf(u)
		if st.ClusterIP == "" || len(st.Ready) == 0 || len(notTrue) > 0 {
			return nil, fmt.Errorf("resource %s: status %+v, conditions not True: %v", n, st, notTrue)
		}
		held[n] = st
	}
	m.held = held
	return held, nil
}

// Current is the latest version seen of a resource.
func (m *statusMonitor) Current(name string) *unstructured.Unstructured {
	m.mu.Lock()
	defer m.mu.Unlock()
	if u := m.current[name]; u != nil {
		return u.DeepCopy()
	}
	return nil
}

// Report is the violations and the number of versions seen.
func (m *statusMonitor) Report() ([]string, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.violations...), m.seen
}
