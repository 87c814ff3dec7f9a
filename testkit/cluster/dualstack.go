// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// IPv6 addresses of a dual-stack cluster (Options.DualStack). Everything comes from 2001:2::/48,
// the block RFC 5180 sets aside for benchmarking, IPv6's counterpart of 198.18.0.0/15: never
// routed on the Internet, and here it only exists inside the test's own namespaces anyway. See
// development/TEST-HARNESS.md ("Dual-stack").
const (
	// gatewayIP6 is the cluster namespace's own IPv6 address (on the gateway link, like
	// gatewayIP): the source of the traffic client's IPv6 requests.
	gatewayIP6 = "2001:2::1"
	// blackholeNextHop6 is the IPv6 default route's next hop: nobody answers neighbour
	// solicitations for it, so the route ends inside the namespace.
	blackholeNextHop6 = "2001:2::fe"
	// podGatewayIP6 is the link-local address of the cluster side of every pod's veth pair and
	// the pods' IPv6 default gateway. Linux answers IPv6 neighbour solicitations only for the
	// addresses of the link they arrive on (unlike ARP), so the pods' next hop must be an
	// address of their own link; link-local scope lets every pair use the same one.
	podGatewayIP6 = "fe80::1"

	// ServiceCIDR6 is the IPv6 ClusterIP range of a dual-stack cluster (the second range of
	// --service-cluster-ip-range).
	ServiceCIDR6 = "2001:2:2::/112"
	// PodCIDR6 holds every pod's IPv6 address.
	PodCIDR6 = "2001:2:1::/64"
	// NodeCIDR6 holds every Node's IPv6 InternalIP; all are addresses of the cluster namespace.
	NodeCIDR6 = "2001:2:0:1::/64"
)

var (
	podRange6  = netip.MustParsePrefix(PodCIDR6)
	nodeRange6 = netip.MustParsePrefix(NodeCIDR6)
)

// alloc6 hands out IPv6 addresses, unique within the process and never reused (as alloc does
// for IPv4).
var alloc6 = &allocator6{nextPod: podRange6.Addr(), nextNode: nodeRange6.Addr()}

type allocator6 struct {
	mu       sync.Mutex
	nextPod  netip.Addr
	nextNode netip.Addr
}

func (a *allocator6) podIP() (netip.Addr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.nextPod = a.nextPod.Next()
	if !podRange6.Contains(a.nextPod) {
		return netip.Addr{}, fmt.Errorf("pod range %s exhausted", PodCIDR6)
	}
	return a.nextPod, nil
}

func (a *allocator6) nodeIP() (netip.Addr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.nextNode = a.nextNode.Next()
	if !nodeRange6.Contains(a.nextNode) {
		return netip.Addr{}, fmt.Errorf("node range %s exhausted", NodeCIDR6)
	}
	return a.nextNode, nil
}

// serviceCIDRs is the --service-cluster-ip-range New gives the API server: IPv4 first, so
// IPv4 is the cluster's primary family (a single-stack Service gets an IPv4 ClusterIP), then
// IPv6 when the cluster is dual-stack.
func serviceCIDRs(opts Options) string {
	if opts.DualStack {
		return ServiceCIDR + "," + ServiceCIDR6
	}
	return ServiceCIDR
}

// dualStackOnce builds the IPv6 side of the cluster namespace once per process: it lives and
// dies with the namespace, and a later IPv4-only cluster is not disturbed by it.
var (
	dualStackOnce sync.Once
	dualStackErr  error
)

// enableDualStack gives the cluster namespace its IPv6 side: forwarding (pods reach each other
// through it, as over IPv4), the gateway address and a default route that ends inside the
// namespace, for the same reasons as the IPv4 ones (a ClusterIP needs a route before
// kube-proxy's DNAT rewrites it). Every address is added with nodad: duplicate address
// detection would leave it unusable ("tentative") for about a second, and nothing here can
// hold the same address.
func enableDualStack() error {
	dualStackOnce.Do(func() {
		if err := writeSysctl("net/ipv6/conf/all/forwarding", "1"); err != nil {
			dualStackErr = err
			return
		}
		if err := writeSysctl("net/ipv6/conf/"+gatewayPeerLink+"/forwarding", "0"); err != nil {
			dualStackErr = err
			return
		}
		dualStackErr = ipBatch("", []string{
			"addr add " + gatewayIP6 + "/64 dev " + gatewayLink + " nodad",
			"route add ::/0 via " + blackholeNextHop6 + " dev " + gatewayLink,
		})
	})
	if dualStackErr != nil {
		return fmt.Errorf("giving the cluster namespace its IPv6 side: %w", dualStackErr)
	}
	return nil
}

// addNodeIPv6 gives a node of a dual-stack cluster its IPv6 address in the cluster namespace and
// adds it to the Node's addresses as a second InternalIP (after the IPv4 one, as a kubelet with
// --node-ip=<v4>,<v6> reports them). kube-proxy reads both at start and programs both families.
func (c *Cluster) addNodeIPv6(ctx context.Context, info *NodeInfo) error {
	ip6, err := alloc6.nodeIP()
	if err != nil {
		return err
	}
	if err := ip("addr", "add", ip6.String()+"/128", "dev", gatewayLink, "nodad"); err != nil {
		return fmt.Errorf("adding the IPv6 address of node %s: %w", info.Name, err)
	}
	info.IP6 = ip6
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node := &corev1.Node{}
		if err := c.Env.Client.Get(ctx, client.ObjectKey{Name: info.Name}, node); err != nil {
			return fmt.Errorf("reading Node %s: %w", info.Name, err)
		}
		addrs := []corev1.NodeAddress{}
		for _, a := range node.Status.Addresses {
			addrs = append(addrs, a)
			if a.Type == corev1.NodeInternalIP && a.Address == info.IP.String() {
				addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip6.String()})
			}
		}
		node.Status.Addresses = addrs
		if err := c.Env.Client.Status().Update(ctx, node); err != nil {
			return fmt.Errorf("writing the IPv6 address of Node %s: %w", info.Name, err)
		}
		return nil
	})
}

// removeNodeIPv6 removes a node's IPv6 address from the cluster namespace (Stop).
func removeNodeIPv6(n NodeInfo) error {
	if !n.IP6.IsValid() {
		return nil
	}
	return ip("addr", "del", n.IP6.String()+"/128", "dev", gatewayLink)
}

// podFamilies are the address families of a new pod, primary first: PodSpec.IPFamilies, or
// the cluster's (IPv4, then IPv6 when dual-stack).
func (c *Cluster) podFamilies(spec PodSpec) ([]corev1.IPFamily, error) {
	if len(spec.IPFamilies) == 0 {
		if c.dualStack {
			return []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}, nil
		}
		return []corev1.IPFamily{corev1.IPv4Protocol}, nil
	}
	if len(spec.IPFamilies) > 2 || (len(spec.IPFamilies) == 2 && spec.IPFamilies[0] == spec.IPFamilies[1]) {
		return nil, fmt.Errorf("pod %s/%s: IPFamilies %v: at most one address per family", spec.Namespace, spec.Name, spec.IPFamilies)
	}
	for _, f := range spec.IPFamilies {
		switch f {
		case corev1.IPv4Protocol:
		case corev1.IPv6Protocol:
			if !c.dualStack {
				return nil, fmt.Errorf("pod %s/%s: an IPv6 address needs a dual-stack cluster (Options.DualStack)", spec.Namespace, spec.Name)
			}
		default:
			return nil, fmt.Errorf("pod %s/%s: unknown IP family %q", spec.Namespace, spec.Name, f)
		}
	}
	return spec.IPFamilies, nil
}

// podIPs allocates a new pod's addresses, one per family, primary first.
func (c *Cluster) podIPs(spec PodSpec) ([]netip.Addr, error) {
	fams, err := c.podFamilies(spec)
	if err != nil {
		return nil, err
	}
	ips := make([]netip.Addr, 0, len(fams))
	for _, f := range fams {
		var a netip.Addr
		if f == corev1.IPv6Protocol {
			a, err = alloc6.podIP()
		} else {
			a, err = alloc.podIP()
		}
		if err != nil {
			return nil, err
		}
		ips = append(ips, a)
	}
	return ips, nil
}

// podNetnsCommands configure the pod's side of its veth pair: its addresses and its default
// routes through the cluster namespace (IPv4: via the cluster namespace's address, which Linux
// answers ARP for on any link; IPv6: via the link-local podGatewayIP6).
func (p *Pod) podNetnsCommands() []string {
	cmds := []string{"link set lo up"}
	for _, a := range p.IPs {
		if a.Is4() {
			cmds = append(cmds, "addr add "+a.String()+"/32 dev eth0")
		} else {
			cmds = append(cmds, "addr add "+a.String()+"/128 dev eth0 nodad")
		}
	}
	cmds = append(cmds, "link set eth0 up")
	for _, a := range p.IPs {
		if a.Is4() {
			cmds = append(cmds,
				"route add "+gatewayIP+"/32 dev eth0 scope link",
				"route add default via "+gatewayIP+" dev eth0")
		} else {
			cmds = append(cmds, "route add ::/0 via "+podGatewayIP6+" dev eth0")
		}
	}
	return cmds
}

// hostLinkCommands configure the cluster side of the pod's veth pair: up, the pods' IPv6
// gateway address when the pod has IPv6 (nodad: usable at once, and the source of the cluster
// side's neighbour solicitations, which a tentative link-local could not send), and a host
// route to each pod address.
func (p *Pod) hostLinkCommands(link string) []string {
	cmds := []string{"link set " + link + " up"}
	for _, a := range p.IPs {
		if a.Is6() {
			cmds = append(cmds, "addr add "+podGatewayIP6+"/64 dev "+link+" nodad")
			break
		}
	}
	for _, a := range p.IPs {
		if a.Is4() {
			cmds = append(cmds, "route add "+a.String()+"/32 dev "+link)
		} else {
			cmds = append(cmds, "route add "+a.String()+"/128 dev "+link)
		}
	}
	return cmds
}

// podIPList is the status.podIPs of the pod.
func (p *Pod) podIPList() []corev1.PodIP {
	out := make([]corev1.PodIP, 0, len(p.IPs))
	for _, a := range p.IPs {
		out = append(out, corev1.PodIP{IP: a.String()})
	}
	return out
}

// hostIPList is the status.hostIPs of a pod on the node: its InternalIPs, IPv4 first.
func hostIPList(n *NodeInfo) []corev1.HostIP {
	out := []corev1.HostIP{{IP: n.IP.String()}}
	if n.IP6.IsValid() {
		out = append(out, corev1.HostIP{IP: n.IP6.String()})
	}
	return out
}

// listenNetwork is the network a pod's servers listen on: "tcp" (IPv6 and IPv4, one socket)
// for a pod with an IPv6 address, "tcp4" otherwise, as before dual-stack clusters existed.
func (p *Pod) listenNetwork() string {
	for _, a := range p.IPs {
		if a.Is6() {
			return "tcp"
		}
	}
	return "tcp4"
}

// IPOf is the pod's address of the family, and whether it has one.
func (p *Pod) IPOf(family corev1.IPFamily) (netip.Addr, bool) {
	for _, a := range p.IPs {
		if familyOf(a) == family {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// DualStack tells whether the cluster was built with Options.DualStack.
func (c *Cluster) DualStack() bool { return c.dualStack }

func familyOf(a netip.Addr) corev1.IPFamily {
	if a.Is4() || a.Is4In6() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

// ClusterIPOf is the Service's ClusterIP of the family (from spec.clusterIPs), for a traffic
// loop that dials it (TrafficOptions.Address).
func (c *Cluster) ClusterIPOf(ctx context.Context, service string, family corev1.IPFamily) (string, error) {
	key, err := splitKey(service)
	if err != nil {
		return "", err
	}
	svc := &corev1.Service{}
	if err := c.Env.Client.Get(ctx, key, svc); err != nil {
		return "", fmt.Errorf("reading Service %s: %w", service, err)
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil && familyOf(a) == family {
			return s, nil
		}
	}
	return "", fmt.Errorf("service %s has no %s ClusterIP (it has %v)", service, family, ips)
}

// ProgrammedEndpointsOf is ProgrammedEndpoints for the Service's ClusterIP of one family: it
// reads kube-proxy's table of that family (ip or ip6 kube-proxy). Endpoints are "ip:port", IPv6
// ones bracketed ("[2001:2:1::5]:8080"), sorted.
func (c *Cluster) ProgrammedEndpointsOf(ctx context.Context, service string, port int32, family corev1.IPFamily) ([]string, error) {
	key, _, sp, err := c.programmedPort(ctx, service, port)
	if err != nil {
		return nil, err
	}
	clusterIP, err := c.ClusterIPOf(ctx, service, family)
	if err != nil {
		return nil, err
	}
	if c.cilium != nil {
		return c.cilium.ciliumProgrammed(ctx, clusterIP, port, strings.ToLower(string(sp.Protocol)))
	}
	table, err := kubeProxyTable(ctx, family)
	if err != nil || table == nil {
		return nil, err
	}
	proto := strings.ToLower(string(sp.Protocol))
	base := fmt.Sprintf("%s/%s/%s/%s", key.Namespace, key.Name, proto, sp.Name)
	return programmedIn(table, clusterIP, proto, port, base), nil
}

// kubeProxyTable lists kube-proxy's nftables table of the family; nil when it has none.
func kubeProxyTable(ctx context.Context, family corev1.IPFamily) ([]byte, error) {
	nftFamily := "ip"
	if family == corev1.IPv6Protocol {
		nftFamily = "ip6"
	}
	table, err := exec.CommandContext(ctx, "nft", "list", "table", nftFamily, "kube-proxy").CombinedOutput()
	if err != nil {
		if bytes.Contains(table, []byte("No such file or directory")) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing kube-proxy's %s table: %w: %s", nftFamily, err, bytes.TrimSpace(table))
	}
	return table, nil
}

// programmedIn reads, from one of kube-proxy's tables, the endpoints new connections to
// clusterIP:port go to (see ProgrammedEndpoints for the shapes of the rules).
func programmedIn(table []byte, clusterIP, proto string, port int32, base string) []string {
	elemRE := regexp.MustCompile(`(?:^|[\s{,])` + regexp.QuoteMeta(clusterIP) + ` \. ` + proto + ` \. ` +
		strconv.Itoa(int(port)) + ` : goto ([A-Za-z0-9_./:-]+)`)
	em := elemRE.FindSubmatch(table)
	if em == nil {
		return nil
	}
	chainRE := regexp.MustCompile(`(?m)^\tchain ` + regexp.QuoteMeta(string(em[1])) + ` \{\n`)
	loc := chainRE.FindIndex(table)
	if loc == nil {
		return nil
	}
	rules := table[loc[1]:]
	if end := bytes.Index(rules, []byte("\n\t}")); end >= 0 {
		rules = rules[:end]
	}
	const addr = `([0-9a-f.:]+)`
	seen := map[string]bool{}
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`dnat (?:ip6? )?to \[?` + addr + `\]?:([0-9]+)`),
		regexp.MustCompile(`[0-9]+ : ` + addr + ` \. ([0-9]+)`),
		regexp.MustCompile(`goto endpoint-[A-Z0-9]{8}-` + regexp.QuoteMeta(base) + `__` + addr + `/([0-9]+)`),
	} {
		for _, m := range re.FindAllSubmatch(rules, -1) {
			seen[net.JoinHostPort(string(m[1]), string(m[2]))] = true
		}
	}
	eps := make([]string, 0, len(seen))
	for ep := range seen {
		eps = append(eps, ep)
	}
	sort.Strings(eps)
	return eps
}

// WaitProgrammedOf is WaitProgrammed for the Service's ClusterIP of one family: it waits (up
// to a minute) until kube-proxy sends new connections to that ClusterIP and port to exactly the
// given pods' addresses of the family (no pods: to nobody).
func (c *Cluster) WaitProgrammedOf(t testing.TB, service string, port int32, family corev1.IPFamily, pods ...*Pod) {
	t.Helper()
	want := make([]string, 0, len(pods))
	for _, p := range pods {
		a, ok := p.IPOf(family)
		if !ok {
			t.Fatalf("WaitProgrammedOf: pod %s has no %s address", p.Key(), family)
		}
		want = append(want, a.String())
	}
	sort.Strings(want)
	deadline := time.Now().Add(time.Minute)
	for {
		eps, err := c.ProgrammedEndpointsOf(t.Context(), service, port, family)
		var got []string
		for _, ep := range eps {
			h, _, _ := net.SplitHostPort(ep)
			got = append(got, h)
		}
		sort.Strings(got)
		if err == nil && slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) || t.Context().Err() != nil {
			if c.cilium != nil {
				t.Fatalf("cilium-agent did not program %s port %d (%s) to %v within a minute: its maps give new connections to %v (last error: %v); they hold:\n%s",
					service, port, family, want, got, err, c.cilium.ciliumDump(context.Background()))
			}
			table, _ := kubeProxyTable(context.Background(), family)
			if len(table) > 6000 {
				table = table[:6000]
			}
			t.Fatalf("kube-proxy did not program %s port %d (%s) to %v within a minute: it has %v (last error: %v); its table:\n%s",
				service, port, family, want, got, err, table)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
