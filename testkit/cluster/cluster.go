// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package cluster builds a small Kubernetes cluster for tests that is real where the module
// touches it: a real kube-apiserver and etcd (testkit/controlplane), Node objects, pods that are
// network namespaces with real addresses and real servers, a real kube-proxy in nftables mode
// that routes ClusterIP traffic from the published EndpointSlices, and a traffic client that
// sends bounded request loops through a Service and records which pod answered each request.
//
// Every test binary that uses it isolates itself first, in TestMain:
//
//	func TestMain(m *testing.M) { cluster.RunIsolated(m) }
//
// and a test then builds what it needs:
//
//	c := cluster.Start(t, cluster.Options{Nodes: []cluster.Node{{Name: "node-a", Zone: "zone-a"}}, KubeProxy: true})
//	p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-0", Node: "node-a"})
//	p.ServeHTTP(t, 8080)
//	... create a Service and EndpointSlices ...
//	c.WaitProgrammed(t, ns+"/web", 80, p)
//	res := c.Traffic(t, cluster.TrafficOptions{Service: ns + "/web", Port: 80, Count: 20}).Wait()
//
// The design (namespaces, addresses, what is shared) is in development/TEST-HARNESS.md.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

// ZoneLabel is the well-known label of a Node's zone.
const ZoneLabel = corev1.LabelTopologyZone

// Node is a simulated node: a Node object with an InternalIP (an address of the cluster
// namespace), the hostname label and, when Zone is set, the zone label. All nodes share the
// cluster namespace as their host network and the one kube-proxy as their datapath, unless
// Options.NodeKubeProxies gives each its own.
type Node struct {
	// Name of the Node object.
	Name string
	// Zone is the topology.kubernetes.io/zone label; empty leaves the label out.
	Zone string
	// Labels are further labels of the Node object.
	Labels map[string]string
}

// Options describe a cluster.
type Options struct {
	// Nodes to create; nil creates one node "node-a" in zone "zone-a".
	Nodes []Node
	// KubeProxy starts a real kube-proxy (nftables mode) in the cluster namespace, acting as the
	// first node. Only one kube-proxy may run in a test binary at a time: several would fight
	// over the same nftables table.
	KubeProxy bool
	// ControlPlane configures the control plane Start starts (API server flags, extra CRDs).
	// When APIServerFlags has no service-cluster-ip-range, ServiceCIDR is used.
	ControlPlane controlplane.Options
	// Env, when set, is an already running control plane (started in this isolated process) to
	// use instead of starting one; Stop then leaves it running and only deletes the Node objects.
	Env *controlplane.Env
	// KubeProxyOutput receives kube-proxy's log. Nil keeps it in a file that is printed when
	// kube-proxy fails to start, or sent to stderr when SWH_TEST_KUBEPROXY_OUTPUT=1.
	KubeProxyOutput io.Writer
	// DualStack makes an IPv4/IPv6 dual-stack cluster (IPv4 primary): the cluster namespace and
	// every node get an IPv6 address too (nodes report both InternalIPs), the API server a
	// dual-stack service range (ServiceCIDR, ServiceCIDR6) and pods an address of each family
	// unless PodSpec.IPFamilies says otherwise; kube-proxy programs both families. With Env
	// set, the running API server must have been started with both ranges. Not with
	// NodeKubeProxies (whose pods are IPv4 only).
	DualStack bool
	// NodeKubeProxies gives every node a network namespace of its own as its host network (the
	// node's InternalIP, the node ends of its pods' veth pairs) and runs a kube-proxy in each
	// (nftables, --hostname-override=<node>, node ports and health check node ports on the
	// node's address), instead of one kube-proxy in the cluster namespace: what
	// externalTrafficPolicy: Local needs, where each node answers from its own local endpoints.
	// It excludes KubeProxy (nothing routes ClusterIPs from the cluster namespace then); pods
	// are IPv4 only and bulk pods are not supported. See development/TEST-HARNESS.md.
	NodeKubeProxies bool
	// Cilium runs a real cilium-agent (tools/cilium) in the cluster namespace instead of
	// kube-proxy, acting as the first node: kube-proxy replacement with its socket load
	// balancer, which sees only this test binary's sockets (development/TEST-HARNESS.md,
	// "Cilium"). WaitProgrammed and ProgrammedEndpoints then read Cilium's BPF maps. With
	// NodeKubeProxies every node's namespace runs its own cilium-agent instead of its
	// kube-proxy (node ports and health check node ports on the node's eth0, no socket load
	// balancer); with DualStack the agent in the cluster namespace runs IPv4 and IPv6. It
	// excludes KubeProxy; the tests that use it run when CiliumEnv is 1 (`make test-cilium`).
	Cilium bool
	// CiliumOutput receives cilium-agent's log. Nil keeps it in a file that is printed when it
	// fails to start, or sends it to stderr when SWH_TEST_CILIUM_OUTPUT=1.
	CiliumOutput io.Writer
}

// Cluster is a running test cluster.
type Cluster struct {
	// Env is the control plane; its API server runs inside the cluster namespace.
	Env *controlplane.Env
	// Nodes are the simulated nodes with their InternalIPs.
	Nodes []NodeInfo

	ownEnv    bool
	kubeProxy *kubeProxy
	cilium    *ciliumAgent
	dualStack bool
	// ciliumDataplane is Options.Cilium: every Node gets a spec.podCIDR (the agent's IPAM
	// needs one) and Dataplane says cilium.
	ciliumDataplane bool
	// nodeNets are the nodes' own networks (Options.NodeKubeProxies), by node name; nil
	// without.
	nodeNets map[string]*nodeNet

	mu   sync.Mutex
	pods map[*Pod]struct{}
}

// NodeInfo is a created node.
type NodeInfo struct {
	Node
	// IP is the node's InternalIP.
	IP netip.Addr
	// IP6 is the node's IPv6 InternalIP in a dual-stack cluster (zero otherwise).
	IP6 netip.Addr
}

// ErrNotRoot is returned by New when the process cannot build network namespaces.
var ErrNotRoot = errors.New("the test cluster needs root (network namespaces, veth pairs, nftables); " +
	"run the tests as root, as `make test` in CI does")

// ErrNotIsolated is returned by New when the test binary did not isolate itself.
var ErrNotIsolated = errors.New("the test cluster only runs in an isolated test binary: " +
	"add `func TestMain(m *testing.M) { cluster.RunIsolated(m) }` (or call cluster.Isolate first in TestMain)")

// kubeProxyMu makes sure only one kube-proxy (or cilium-agent) runs in the cluster namespace
// at a time.
var (
	kubeProxyMu      sync.Mutex
	kubeProxyRunning bool
)

// Start builds a cluster that is removed when the test ends. Without root it skips the test
// with a message saying why; when the binary is not isolated it fails.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	c, err := New(opts)
	if errors.Is(err, ErrNotRoot) {
		t.Skipf("cluster: %v", err)
	}
	if err != nil {
		t.Fatalf("cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stopping the test cluster: %v", err)
		}
	})
	return c
}

// SkipUnlessIsolated skips the test without root and fails it when the binary is root but not
// isolated (TestMain does not call RunIsolated or Isolate); Start does the same.
func SkipUnlessIsolated(t testing.TB) {
	t.Helper()
	switch err := checkIsolated(); {
	case errors.Is(err, ErrNotRoot):
		t.Skipf("cluster: %v", err)
	case err != nil:
		t.Fatalf("cluster: %v", err)
	}
}

func checkIsolated() error {
	if Isolated() {
		return nil
	}
	if notIsolatedReason != "" || os.Geteuid() != 0 {
		return ErrNotRoot
	}
	return ErrNotIsolated
}

// New builds a cluster; call Stop when done. It is for a TestMain that shares one cluster
// between tests; tests use Start.
func New(opts Options) (c *Cluster, err error) {
	if err := checkIsolated(); err != nil {
		return nil, err
	}
	if len(opts.Nodes) == 0 {
		opts.Nodes = []Node{{Name: "node-a", Zone: "zone-a"}}
	}
	if opts.NodeKubeProxies && opts.KubeProxy {
		return nil, errors.New("options KubeProxy and NodeKubeProxies exclude each other: every node runs its own kube-proxy with NodeKubeProxies")
	}
	if opts.NodeKubeProxies && opts.DualStack {
		return nil, errors.New("options DualStack and NodeKubeProxies exclude each other: the nodes' own networks are IPv4 only")
	}
	if opts.Cilium && opts.KubeProxy {
		return nil, errors.New("options Cilium and KubeProxy exclude each other: cilium-agent is the datapath")
	}
	var ciliumBin, ciliumModule string
	if opts.Cilium {
		if ciliumBin, ciliumModule, err = ciliumAssets(); err != nil {
			return nil, err
		}
		if opts.Env == nil {
			opts.ControlPlane.ExtraCRDPaths = append(slices.Clone(opts.ControlPlane.ExtraCRDPaths), ciliumCRDPaths(ciliumModule)...)
		}
	}
	c = &Cluster{Env: opts.Env, pods: map[*Pod]struct{}{}, dualStack: opts.DualStack, ciliumDataplane: opts.Cilium}
	if opts.NodeKubeProxies {
		c.nodeNets = map[string]*nodeNet{}
	}
	defer func() {
		if err != nil {
			if serr := c.Stop(); serr != nil {
				err = fmt.Errorf("%w (and cleaning up: %w)", err, serr)
			}
			c = nil
		}
	}()
	if c.Env == nil {
		cp := opts.ControlPlane
		flags := map[string]string{"service-cluster-ip-range": serviceCIDRs(opts)}
		for k, v := range cp.APIServerFlags {
			flags[k] = v
		}
		cp.APIServerFlags = flags
		env, err := controlplane.Start(cp)
		if err != nil {
			return c, err
		}
		c.Env, c.ownEnv = env, true
	}
	if opts.DualStack {
		if err := enableDualStack(); err != nil {
			return c, err
		}
	}
	if opts.Cilium && !c.ownEnv {
		if err := installCiliumCRDs(c.Env, ciliumModule); err != nil {
			return c, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, n := range opts.Nodes {
		info, err := c.addNode(ctx, n)
		if err != nil {
			return c, err
		}
		if opts.DualStack {
			if err := c.addNodeIPv6(ctx, &info); err != nil {
				c.Nodes = append(c.Nodes, info) // so Stop removes its addresses
				return c, err
			}
		}
		c.Nodes = append(c.Nodes, info)
	}
	if opts.NodeKubeProxies {
		var cilium *ciliumBinaries
		out := opts.KubeProxyOutput
		if opts.Cilium {
			cilium, out = &ciliumBinaries{bin: ciliumBin, module: ciliumModule}, opts.CiliumOutput
		}
		if err := c.startNodeKubeProxies(ctx, out, cilium); err != nil {
			return c, err
		}
	}
	if opts.Cilium && !opts.NodeKubeProxies {
		if err := claimDatapath(); err != nil {
			return c, err
		}
		ca, err := startCilium(ctx, c.Env, c.Nodes[0], ciliumPlace{device: gatewayLink, socketLB: true, ipv6: opts.DualStack}, ciliumModule, ciliumBin, opts.CiliumOutput)
		if ca != nil {
			c.cilium = ca
		} else {
			releaseKubeProxy()
		}
		if err != nil {
			return c, err
		}
	}
	if opts.KubeProxy {
		if err := claimDatapath(); err != nil {
			return c, err
		}
		kp, err := startKubeProxy(ctx, c.Env, opts.Nodes[0].Name, opts.KubeProxyOutput)
		if kp != nil {
			c.kubeProxy = kp
		} else {
			releaseKubeProxy()
		}
		if err != nil {
			return c, err
		}
	}
	return c, nil
}

// claimDatapath takes the cluster namespace's one datapath (kube-proxy or cilium-agent) for a
// cluster; releaseKubeProxy gives it back.
func claimDatapath() error {
	kubeProxyMu.Lock()
	defer kubeProxyMu.Unlock()
	if kubeProxyRunning {
		return errors.New("another cluster of this test binary runs kube-proxy or cilium-agent in the cluster namespace: share that cluster, or stop it first")
	}
	kubeProxyRunning = true
	return nil
}

// Dataplanes a cluster can run (Cluster.Dataplane).
const (
	DataplaneKubeProxy = "kube-proxy"
	DataplaneCilium    = "cilium"
)

// Dataplane is what routes the cluster's Services: DataplaneCilium with Options.Cilium,
// DataplaneKubeProxy otherwise.
func (c *Cluster) Dataplane() string {
	if c.ciliumDataplane {
		return DataplaneCilium
	}
	return DataplaneKubeProxy
}

func releaseKubeProxy() {
	kubeProxyMu.Lock()
	kubeProxyRunning = false
	kubeProxyMu.Unlock()
}

// Node returns the node with the name; it panics when there is none (a test's typo).
func (c *Cluster) Node(name string) NodeInfo {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	panic(fmt.Sprintf("cluster: no node %q", name))
}

// addNode gives the node an address in the cluster namespace and creates its Node object.
func (c *Cluster) addNode(ctx context.Context, n Node) (NodeInfo, error) {
	nodeIP, err := alloc.nodeIP()
	if err != nil {
		return NodeInfo{}, err
	}
	info := NodeInfo{Node: n, IP: nodeIP}
	if c.nodeNets != nil {
		if err := c.addNodeNetwork(n.Name, nodeIP); err != nil {
			c.Nodes = append(c.Nodes, info) // so Stop removes what was made
			return NodeInfo{}, err
		}
	} else if err := ip("addr", "add", nodeIP.String()+"/32", "dev", gatewayLink); err != nil {
		return NodeInfo{}, fmt.Errorf("adding the address of node %s: %w", n.Name, err)
	}
	labels := map[string]string{corev1.LabelHostname: n.Name, corev1.LabelOSStable: "linux"}
	if n.Zone != "" {
		labels[ZoneLabel] = n.Zone
	}
	for k, v := range n.Labels {
		labels[k] = v
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels}}
	if c.ciliumDataplane {
		cidr := ciliumPodCIDR(len(c.Nodes))
		node.Spec.PodCIDR, node.Spec.PodCIDRs = cidr, []string{cidr}
		if c.dualStack {
			node.Spec.PodCIDRs = append(node.Spec.PodCIDRs, ciliumPodCIDR6(len(c.Nodes)))
		}
	}
	if err := c.Env.Client.Create(ctx, node); err != nil {
		// Keep the address listed so Stop removes it.
		c.Nodes = append(c.Nodes, info)
		return NodeInfo{}, fmt.Errorf("creating Node %s: %w", n.Name, err)
	}
	node.Status = corev1.NodeStatus{
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: nodeIP.String()},
			{Type: corev1.NodeHostName, Address: n.Name},
		},
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "simulated by testkit/cluster", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
		}},
		NodeInfo: corev1.NodeSystemInfo{OperatingSystem: "linux", Architecture: "amd64", KubeletVersion: "v1.37.2"},
	}
	if err := c.Env.Client.Status().Update(ctx, node); err != nil {
		c.Nodes = append(c.Nodes, info)
		return NodeInfo{}, fmt.Errorf("writing the status of Node %s: %w", n.Name, err)
	}
	return info, nil
}

// Stop removes everything the cluster made: pods still present (objects, namespaces, links,
// processes), kube-proxy and its nftables tables, the nodes' addresses and objects, and the
// control plane when Start started it. It keeps going after an error and returns them all.
func (c *Cluster) Stop() error {
	var errs []error
	c.mu.Lock()
	pods := make([]*Pod, 0, len(c.pods))
	for p := range c.pods {
		pods = append(pods, p)
	}
	c.mu.Unlock()
	for _, p := range pods {
		if err := p.remove(context.Background()); err != nil {
			errs = append(errs, err)
		}
	}
	if c.cilium != nil {
		if err := c.cilium.stop(); err != nil {
			errs = append(errs, err)
		}
		c.cilium = nil
		releaseKubeProxy()
	}
	if c.kubeProxy != nil {
		if err := c.kubeProxy.stop(); err != nil {
			errs = append(errs, err)
		}
		c.kubeProxy = nil
		releaseKubeProxy()
	}
	for _, n := range c.Nodes {
		if !c.ownEnv && c.Env != nil {
			err := c.Env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}})
			if client.IgnoreNotFound(err) != nil {
				errs = append(errs, fmt.Errorf("deleting Node %s: %w", n.Name, err))
			}
		}
		if nn := c.nodeNet(n.Name); nn != nil {
			if err := nn.remove(); err != nil {
				errs = append(errs, err)
			}
		} else if err := ip("addr", "del", n.IP.String()+"/32", "dev", gatewayLink); err != nil {
			errs = append(errs, err)
		}
		if err := removeNodeIPv6(n); err != nil {
			errs = append(errs, err)
		}
	}
	c.Nodes = nil
	if c.ownEnv && c.Env != nil {
		if err := c.Env.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stopping the control plane: %w", err))
		}
		c.Env = nil
	}
	return errors.Join(errs...)
}

// isNotFound reports whether err says the object does not exist.
func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
