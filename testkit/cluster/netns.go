// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Addresses. Everything comes from 198.18.0.0/15, the range RFC 2544 sets aside for network
// benchmarks: it is never routed on the Internet nor used by this machine's networks, and
// here it lives only inside the test's own network namespaces anyway. See
// development/TEST-HARNESS.md.
const (
	// netnsDir is where `ip netns` keeps named namespaces; Isolate mounts a private tmpfs on it.
	netnsDir = "/run/netns"

	// gatewayLink and gatewayPeerLink are the veth pair that carries the default route of the
	// cluster namespace; both ends stay in it.
	gatewayLink     = "swhgw0"
	gatewayPeerLink = "swhgw1"
	// gatewayIP is the cluster namespace's own address (the API server advertises it; pods
	// route through it).
	gatewayIP = "198.19.0.1"
	// TrafficClientIP is the cluster namespace's second address, the source of the traffic
	// loops' IPv4 requests (clientDialer). The agents probe pods from gatewayIP; a client on
	// the same address whose ClusterIP connection kube-proxy DNATs to a pod can meet a probe's
	// conntrack entry (often TIME_WAIT) with the same reply tuple, and the kernel then drops
	// every SYN of that connection: a connect timeout the product did not cause (seen as
	// `dial tcp <ClusterIP>:3306: i/o timeout` in the demo and reproduced alone, development/
	// TEST-HARNESS.md, "The traffic client's address"). In a cluster, clients are pods with
	// addresses of their own, or node processes that kube-proxy masquerades.
	TrafficClientIP = "198.19.0.2"
	// trafficClientExtra is the first of the further client addresses (198.19.0.64–126): a
	// connection to each IPv4 destination leaves from an address of its own (ClientSource), so
	// connections to two ClusterIPs that kube-proxy DNATs to the same pod (the demo's
	// mysql-db-read and mysql-db-write both reach the primary) never share a reply tuple either.
	// With one client address they did: a connection to one ClusterIP met the other's entry in
	// TIME_WAIT and lost every SYN (development/TEST-HARNESS.md, "The traffic client's address").
	trafficClientExtra = "198.19.0.64"
	// trafficClientAddrs is how many client addresses there are: TrafficClientIP and 63 from
	// trafficClientExtra.
	trafficClientAddrs = 64
	// blackholeNextHop is the default route's next hop: nobody answers ARP for it.
	blackholeNextHop = "198.19.0.254"

	// ServiceCIDR is the ClusterIP range Start gives the API server unless the caller sets
	// service-cluster-ip-range.
	ServiceCIDR = "198.19.128.0/17"
	// PodCIDR holds every pod address.
	PodCIDR = "198.18.0.0/16"
	// NodeCIDR holds every Node's InternalIP; all are addresses of the cluster namespace.
	NodeCIDR = "198.19.1.0/24"
)

var (
	podRange  = netip.MustParsePrefix(PodCIDR)
	nodeRange = netip.MustParsePrefix(NodeCIDR)
)

// allocator hands out addresses and names that are unique within the process and never reused,
// so a conntrack entry or a late packet never meets a newer pod with the same address.
type allocator struct {
	mu      sync.Mutex
	nextPod netip.Addr
	node    int
	seq     int
}

var alloc = &allocator{nextPod: podRange.Addr()}

func (a *allocator) podIP() (netip.Addr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for {
		a.nextPod = a.nextPod.Next()
		if !podRange.Contains(a.nextPod) {
			return netip.Addr{}, fmt.Errorf("pod range %s exhausted", PodCIDR)
		}
		// Skip .0 and .255: valid for /32 hosts, but they read like network and broadcast.
		if b := a.nextPod.As4(); b[3] != 0 && b[3] != 255 {
			return a.nextPod, nil
		}
	}
}

func (a *allocator) nodeIP() (netip.Addr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.node++
	b := nodeRange.Addr().As4()
	if a.node > 254 {
		return netip.Addr{}, fmt.Errorf("node range %s exhausted", NodeCIDR)
	}
	b[3] = byte(a.node)
	return netip.AddrFrom4(b), nil
}

// next returns a process-wide sequence number for names.
func (a *allocator) next() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seq++
	return a.seq
}

// namePrefix starts every network namespace name: "swh<PID of the outer test process>-". The
// names live in the private /run/netns of this test binary; the PID makes them readable.
func namePrefix() string {
	pid := os.Getenv(outerPIDEnv)
	if pid == "" {
		pid = strconv.Itoa(os.Getpid())
	}
	return "swh" + pid + "-"
}

// tempDirRegistry remembers the temporary directories the harness made, for Leftovers.
type tempDirRegistry struct {
	mu   sync.Mutex
	dirs []string
}

var tempDirs = &tempDirRegistry{}

func (r *tempDirRegistry) make(pattern string) (string, error) {
	d, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", fmt.Errorf("creating a temporary directory: %w", err)
	}
	r.mu.Lock()
	r.dirs = append(r.dirs, d)
	r.mu.Unlock()
	return d, nil
}

func (r *tempDirRegistry) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.dirs...)
}

// ipBatch runs `ip -batch -` with the commands, in the network namespace netns ("" is the
// cluster namespace).
func ipBatch(netns string, cmds []string) error {
	args := []string{"-batch", "-"}
	if netns != "" {
		args = append([]string{"-n", netns}, args...)
	}
	cmd := exec.Command("ip", args...)
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		where := "the cluster namespace"
		if netns != "" {
			where = "namespace " + netns
		}
		return fmt.Errorf("ip in %s: %q: %w: %s", where, cmds, err, bytes.TrimSpace(out))
	}
	return nil
}

// ip runs one ip command.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// linkNames lists the links of a network namespace ("" is the cluster namespace).
func linkNames(netns string) ([]string, error) {
	args := []string{"-j", "link", "show"}
	if netns != "" {
		args = append([]string{"-n", netns}, args...)
	}
	out, err := exec.Command("ip", args...).Output()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var links []struct {
		Name string `json:"ifname"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		return nil, fmt.Errorf("parsing ip -j link show: %w", err)
	}
	names := make([]string, 0, len(links))
	for _, l := range links {
		names = append(names, l.Name)
	}
	return names, nil
}

// inNetns runs fn on an OS thread that has joined the network namespace at path. Sockets fn
// creates belong to that namespace for their whole life, whichever thread uses them later.
func inNetns(path string, fn func() error) error {
	target, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", path, err)
	}
	defer func() { _ = target.Close() }()
	errc := make(chan error, 1)
	go func() {
		// A thread whose namespace cannot be restored stays locked and dies with this goroutine.
		runtime.LockOSThread()
		orig, err := os.Open(filepath.Join("/proc/thread-self/ns/net"))
		if err != nil {
			errc <- fmt.Errorf("opening the current network namespace: %w", err)
			return
		}
		defer func() { _ = orig.Close() }()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("joining network namespace %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("returning from network namespace %s: %w", path, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// trafficClientAddr is the i-th traffic client address (0 <= i < trafficClientAddrs):
// TrafficClientIP, then trafficClientExtra and the addresses after it.
func trafficClientAddr(i int) netip.Addr {
	if i == 0 {
		return netip.MustParseAddr(TrafficClientIP)
	}
	a := netip.MustParseAddr(trafficClientExtra).As4()
	a[3] += byte(i - 1)
	return netip.AddrFrom4(a)
}
