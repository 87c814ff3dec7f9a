// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

// This file holds Options.NodeKubeProxies: every node a network namespace of its own (its host
// network) with its own kube-proxy, so that each node answers node ports and health check node
// ports from its own local endpoints, as externalTrafficPolicy: Local needs. The layout is in
// development/TEST-HARNESS.md ("Nodes with their own kube-proxy").

// Ports of a node's kube-proxy on the node's address (each node has its own address, so the
// upstream defaults can be used as they are).
const (
	nodeKubeProxyHealthzPort = 10256
	nodeKubeProxyMetricsPort = 10249
)

// nodeKubeProxyConfig is a node's kube-proxy configuration: nftables mode, node ports (and so
// health check node ports) only on the node's own address, healthz and metrics on it too, no
// conntrack sysctl writes, a short minimum sync period. The node name comes from
// --hostname-override on the command line.
const nodeKubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: %q
  qps: 100
  burst: 200
healthzBindAddress: %s
metricsBindAddress: %s
nodePortAddresses: [%q]
` + kubeProxyConfigCommon

// nodeNet is the host network of a node of a cluster with NodeKubeProxies: a network namespace
// joined to the cluster namespace by a veth pair, holding the node's InternalIP, the node ends
// of its pods' veth pairs and its kube-proxy.
type nodeNet struct {
	node  string
	ip    netip.Addr
	netns string
	// link is the cluster-side end of the node's veth pair ("eth0" in the node).
	link string

	mu        sync.Mutex
	api       *apiForwarder
	kubeProxy *kubeProxy
	// cilium is the node's cilium-agent instead of kube-proxy (Options.Cilium).
	cilium *ciliumAgent
}

// ciliumBinaries are the agent's binaries and module folder (ciliumAssets).
type ciliumBinaries struct{ bin, module string }

func (nn *nodeNet) netnsPath() string { return filepath.Join(netnsDir, nn.netns) }

// addNodeNetwork builds the node's namespace: lo, eth0 with the node's address, a link route to
// the cluster namespace's address and the default route through it, forwarding on (the node
// routes between its pods and the cluster namespace), and in the cluster namespace the host
// route to the node. It is registered in c.nodeNets before the first step, so Stop removes
// whatever was made.
func (c *Cluster) addNodeNetwork(node string, nodeIP netip.Addr) error {
	n := alloc.next()
	nn := &nodeNet{node: node, ip: nodeIP}
	c.mu.Lock()
	c.nodeNets[node] = nn
	c.mu.Unlock()
	netns := namePrefix() + "n" + strconv.Itoa(n)
	link := "swhn" + strconv.Itoa(n)
	if err := ip("netns", "add", netns); err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	nn.netns = netns
	if err := ipBatch("", []string{"link add " + link + " type veth peer name eth0 netns " + netns}); err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	nn.link = link
	if err := ipBatch(netns, []string{
		"link set lo up",
		"addr add " + nodeIP.String() + "/32 dev eth0",
		"link set eth0 up",
		"route add " + gatewayIP + "/32 dev eth0 scope link",
		"route add default via " + gatewayIP + " dev eth0",
	}); err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	if err := inNetns(nn.netnsPath(), func() error { return writeSysctl("net/ipv4/ip_forward", "1") }); err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	if err := ipBatch("", []string{
		"link set " + link + " up",
		"route add " + nodeIP.String() + "/32 dev " + link,
	}); err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	return nil
}

// nodeNet returns the node's own network, nil when the node lives in the cluster namespace.
func (c *Cluster) nodeNet(node string) *nodeNet {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodeNets[node]
}

// remove stops the node's kube-proxy and API forwarder and deletes its namespace and links
// (the pods' node ends go with the namespace). Idempotent.
func (nn *nodeNet) remove() error {
	nn.mu.Lock()
	defer nn.mu.Unlock()
	var errs []error
	if nn.cilium != nil {
		if err := nn.cilium.stop(); err != nil {
			errs = append(errs, err)
		}
		nn.cilium = nil
	}
	if nn.kubeProxy != nil {
		// Its nftables tables live in the node's namespace and go with it.
		_ = nn.kubeProxy.proc.Stop() // a kube-proxy that had to be killed has still stopped
		_ = os.RemoveAll(nn.kubeProxy.dir)
		nn.kubeProxy = nil
	}
	if nn.api != nil {
		nn.api.stop()
		nn.api = nil
	}
	if nn.link != "" {
		if err := ip("link", "del", nn.link); err != nil && !isNoDevice(err) {
			errs = append(errs, err)
		} else {
			nn.link = ""
		}
	}
	if nn.netns != "" {
		if err := ip("netns", "del", nn.netns); err != nil && !strings.Contains(err.Error(), "No such file") {
			errs = append(errs, err)
		} else {
			nn.netns = ""
		}
	}
	return errors.Join(errs...)
}

// startKubeProxy runs the node's kube-proxy inside the node's namespace (nsenter, so its
// nftables tables, node port listeners and health check servers are the node's) and waits until
// its healthz answers 200 on the node's address. The API server listens on the cluster
// namespace's loopback, so the node gets a forwarder on its own loopback at the same address
// (the kubeconfig and the serving certificate stay valid).
func (nn *nodeNet) startKubeProxy(ctx context.Context, env *controlplane.Env, out io.Writer, cilium *ciliumBinaries) error {
	nn.mu.Lock()
	defer nn.mu.Unlock()
	u, err := url.Parse(env.APIServerURL())
	if err != nil {
		return fmt.Errorf("parsing the API server's address %q: %w", env.APIServerURL(), err)
	}
	if nn.api, err = startAPIForwarder(nn.netnsPath(), u.Host); err != nil {
		return fmt.Errorf("node %s: %w", nn.node, err)
	}
	if cilium != nil {
		node := NodeInfo{Node: Node{Name: nn.node}, IP: nn.ip}
		nn.cilium, err = startCilium(ctx, env, node, ciliumPlace{netns: nn.netnsPath(), device: "eth0", moreDevices: []string{"swhp+"}}, cilium.module, cilium.bin, out)
		return err
	}
	bin, err := controlplane.Binary("kube-proxy")
	if err != nil {
		return err
	}
	dir, err := tempDirs.make("swh-kube-proxy-" + nn.node + "-")
	if err != nil {
		return err
	}
	kubeconfig, err := env.WriteKubeConfig(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return err
	}
	healthz := net.JoinHostPort(nn.ip.String(), strconv.Itoa(nodeKubeProxyHealthzPort))
	metrics := net.JoinHostPort(nn.ip.String(), strconv.Itoa(nodeKubeProxyMetricsPort))
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, nodeKubeProxyConfig, kubeconfig, healthz, metrics, nn.ip.String()+"/32"), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return fmt.Errorf("writing the kube-proxy config of node %s: %w", nn.node, err)
	}
	if out == nil && os.Getenv("SWH_TEST_KUBEPROXY_OUTPUT") == "1" {
		out = os.Stderr
	}
	// nsenter joins the network namespace and then becomes kube-proxy (same PID).
	cmd := exec.Command("nsenter", "--net="+nn.netnsPath(), "--", bin, "--config", cfgPath, "--hostname-override="+nn.node)
	opts := process.Options{Grace: 10 * time.Second, Group: true}
	if out != nil {
		cmd.Stdout, cmd.Stderr = out, out
	} else {
		opts.LogFile = filepath.Join(dir, "kube-proxy.log")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	proc, err := process.Start("kube-proxy of "+nn.node, cmd, opts)
	if err != nil {
		_ = os.RemoveAll(dir)
		return err
	}
	nn.kubeProxy = &kubeProxy{proc: proc, dir: dir}
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := proc.WaitHTTP(waitCtx, "http://"+healthz+"/healthz"); err != nil {
		return fmt.Errorf("the kube-proxy of node %s is not healthy: %w; its output ends with:\n%s", nn.node, err, proc.Output(4000))
	}
	return nil
}

// startNodeKubeProxies starts every node's kube-proxy side by side and waits for all of them.
func (c *Cluster) startNodeKubeProxies(ctx context.Context, out io.Writer, cilium *ciliumBinaries) error {
	var wg sync.WaitGroup
	errs := make([]error, len(c.Nodes))
	for i, n := range c.Nodes {
		nn := c.nodeNet(n.Name)
		if nn == nil {
			continue
		}
		wg.Go(func() { errs[i] = nn.startKubeProxy(ctx, c.Env, out, cilium) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// NodeKubeProxyPID is the process id of the node's own kube-proxy (Options.NodeKubeProxies), 0
// when it has none.
func (c *Cluster) NodeKubeProxyPID(node string) int {
	nn := c.nodeNet(node)
	if nn == nil {
		return 0
	}
	nn.mu.Lock()
	defer nn.mu.Unlock()
	if nn.kubeProxy == nil {
		return 0
	}
	return nn.kubeProxy.proc.PID()
}

// InNodeNetns runs fn on an OS thread inside the node's own network namespace
// (Options.NodeKubeProxies): sockets fn creates belong to the node's host network.
func (c *Cluster) InNodeNetns(node string, fn func() error) error {
	nn := c.nodeNet(node)
	if nn == nil {
		return fmt.Errorf("node %q has no network namespace of its own (Options.NodeKubeProxies)", node)
	}
	return inNetns(nn.netnsPath(), fn)
}

// createNetworkOnNode is createNetwork for a node with its own namespace: the pod's veth pair
// joins the pod to the node (HostLink is in the node's namespace), the pod's gateway is the
// node's address, and the cluster namespace routes the pod's address through the node.
func (p *Pod) createNetworkOnNode(nn *nodeNet) error {
	n := alloc.next()
	netns := namePrefix() + "p" + strconv.Itoa(n)
	link := "swhp" + strconv.Itoa(n)
	if err := ip("netns", "add", netns); err != nil {
		return err
	}
	p.Netns = netns
	p.nodeNet = nn
	if err := ipBatch(nn.netns, []string{
		"link add " + link + " type veth peer name eth0 netns " + netns,
	}); err != nil {
		return err
	}
	p.HostLink = link
	node := nn.ip.String()
	if err := ipBatch(netns, []string{
		"link set lo up",
		"addr add " + p.IP.String() + "/32 dev eth0",
		"link set eth0 up",
		"route add " + node + "/32 dev eth0 scope link",
		"route add default via " + node + " dev eth0",
	}); err != nil {
		return err
	}
	if err := ipBatch(nn.netns, []string{
		"link set " + link + " up",
		"route add " + p.IP.String() + "/32 dev " + link,
	}); err != nil {
		return err
	}
	if err := ipBatch("", []string{"route add " + p.IP.String() + "/32 via " + node + " dev " + nn.link}); err != nil {
		return err
	}
	nn.mu.Lock()
	ca := nn.cilium
	nn.mu.Unlock()
	if ca != nil {
		// The node's cilium-agent takes the pod's veth as a device (--devices swhp+) and
		// attaches its host programs to it, which reverse-translate the pod's replies to node
		// port traffic: wait for them before anything may send to the pod.
		return waitTCXAttached(nn.netnsPath(), link, time.Minute)
	}
	return nil
}

// detachFromNode removes what createNetworkOnNode made outside the pod's namespace: the node end
// of the veth pair (which removes the pair) and the cluster namespace's route to the pod.
func (p *Pod) detachFromNode() error {
	var errs []error
	if p.HostLink != "" && p.nodeNet.netns != "" {
		if err := ipBatch(p.nodeNet.netns, []string{"link del " + p.HostLink}); err != nil && !isNoDevice(err) {
			errs = append(errs, err)
		}
	}
	if err := ip("route", "del", p.IP.String()+"/32"); err != nil && !strings.Contains(err.Error(), "No such process") {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// apiForwarder accepts connections on an address of a node's own loopback and forwards each to
// the same address in the cluster namespace (the API server), byte for byte: TLS stays end to
// end between the client and the API server.
type apiForwarder struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
	wg    sync.WaitGroup
}

func startAPIForwarder(netnsPath, addr string) (*apiForwarder, error) {
	var ln net.Listener
	if err := inNetns(netnsPath, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		return nil, fmt.Errorf("listening on %s for the API server: %w", addr, err)
	}
	f := &apiForwarder{ln: ln, target: addr, conns: map[net.Conn]struct{}{}}
	f.wg.Go(f.acceptLoop)
	return f, nil
}

func (f *apiForwarder) acceptLoop() {
	for {
		in, err := f.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		// Dialled from this goroutine's thread, which is in the cluster namespace.
		out, err := net.DialTimeout("tcp", f.target, 10*time.Second)
		if err != nil {
			_ = in.Close()
			continue
		}
		if !f.track(in, out) {
			return
		}
		f.wg.Go(func() { f.pipe(in, out) })
	}
}

// track remembers an open pair so stop can close it; false when the forwarder is stopping.
func (f *apiForwarder) track(conns ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		f.conns[c] = struct{}{}
	}
	return true
}

// pipe copies both ways until either side ends, then closes both.
func (f *apiForwarder) pipe(in, out net.Conn) {
	var once sync.Once
	closeBoth := func() {
		_ = in.Close()
		_ = out.Close()
	}
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(out, in); once.Do(closeBoth) })
	wg.Go(func() { _, _ = io.Copy(in, out); once.Do(closeBoth) })
	wg.Wait()
	f.mu.Lock()
	delete(f.conns, in)
	delete(f.conns, out)
	f.mu.Unlock()
}

// stop closes the listener and every forwarded connection and waits for the goroutines.
func (f *apiForwarder) stop() {
	f.mu.Lock()
	f.done = true
	_ = f.ln.Close()
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}
