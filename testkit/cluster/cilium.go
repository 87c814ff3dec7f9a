// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

// CiliumEnv turns the Cilium dataplane on: `make test-cilium` sets it to 1. A cluster with
// Options.Cilium needs the cilium tool group (tools/build.sh cilium, about a quarter of an hour
// on a fresh machine), clang >= 18.1 and a private iptables (hack/deps.sh --cilium), so `make
// test` leaves it out.
const CiliumEnv = "SWH_CILIUM"

// CiliumEnabled reports whether CiliumEnv is 1.
func CiliumEnabled() bool { return os.Getenv(CiliumEnv) == "1" }

// ciliumModule is the module whose cilium-agent tools/cilium builds; its bpf/ folder holds the
// datapath's C sources, which the agent compiles at run time.
const ciliumModule = "github.com/cilium/cilium"

// ciliumClangs are the compilers tried, newest first: Cilium 1.20 wants clang >= 18.1
// (Documentation/operations/system_requirements.rst); Debian 12 has clang-19.
var ciliumClangs = []string{"clang-19", "clang-20", "clang-21", "clang-22", "clang-18"}

// ciliumNativeRoutingCIDR is every address of the bed (pods, nodes, the cluster namespace,
// ClusterIPs: 198.18.0.0/15): Cilium routes it natively and masquerades nothing.
const ciliumNativeRoutingCIDR = "198.18.0.0/15"

// ciliumNativeRoutingCIDR6 holds every IPv6 address of a dual-stack bed (2001:2:0::/64 the
// cluster namespace, 2001:2:0:1::/64 nodes, 2001:2:1::/64 pods, 2001:2:2::/112 ClusterIPs and
// ciliumPodCIDR6).
const ciliumNativeRoutingCIDR6 = "2001:2::/46"

// ciliumPodCIDR6 is the i-th Node's IPv6 spec.podCIDRs entry in a dual-stack cluster: a range
// nothing else uses, for the agent's IPv6 router address.
func ciliumPodCIDR6(i int) string { return fmt.Sprintf("2001:2:3:%x::/64", i) }

// ciliumPodCIDR is the Node's spec.podCIDR the agent's IPAM (ipam=kubernetes) takes the router
// address of its cilium_host link from: the i-th node gets 198.19.(2+i).0/24, a range no pod of
// the harness (198.18.0.0/16) or node (198.19.1.0/24) uses, so the router address collides with
// nothing. The harness's pods are not Cilium endpoints; their addresses come from PodCIDR.
func ciliumPodCIDR(i int) string { return fmt.Sprintf("198.19.%d.0/24", 2+i) }

// ciliumAgentScript runs as `sh -c` inside the agent's own mount namespace (unshare --mount,
// private propagation): a bpffs of its own on /sys/fs/bpf (so nothing is pinned outside, and
// the pins go with the namespace), an empty tmpfs on /run (the agent's other sockets and state
// default to /run/cilium: none of it may land on the machine's /run), /proc/sys/kernel
// read-only (the agent would otherwise set kernel.unprivileged_bpf_disabled and
// kernel.timer_migration, which are the machine's, not the namespace's; it ignores the
// refusal), then the agent.
const ciliumAgentScript = `set -eu
mount -t bpf bpf /sys/fs/bpf
mount -t tmpfs -o mode=0755,size=64m tmpfs /run
mount --bind /proc/sys/kernel /proc/sys/kernel
mount -o remount,bind,ro /proc/sys/kernel
exec "$@"`

// ciliumPlace is where an agent runs: the cluster namespace (the first node's datapath, with
// the socket load balancer for the test binary's own sockets) or a node's own namespace
// (Options.NodeKubeProxies: node ports and health check node ports on the node's device).
type ciliumPlace struct {
	// netns is the node's network namespace path; "" is the cluster namespace.
	netns string
	// device is the agent's main device (--devices, --direct-routing-device).
	device string
	// moreDevices are further --devices patterns.
	moreDevices []string
	// socketLB attaches the socket load balancer to a sub-cgroup holding this test process;
	// without, the sub-cgroup stays empty and the agent runs with --bpf-lb-sock=false.
	socketLB bool
	// ipv6 runs the agent dual-stack (Options.DualStack): IPv6 too, natively routed.
	ipv6 bool
}

// ciliumAgent is a running cilium-agent acting as a node's kube-proxy replacement.
type ciliumAgent struct {
	place  ciliumPlace
	proc   *process.Process
	dir    string
	dbg    string
	socket string
	// tablesBefore are the nftables tables of the cluster namespace before the agent started:
	// stop deletes the ones its iptables (nft backend) made.
	tablesBefore map[string]bool
	// cgroupRoot is a cgroup2 mount of the whole hierarchy in this process's mount namespace;
	// cgroup the sub-cgroup (under it) that holds this process and that the agent attaches its
	// socket load balancer to; cgroupMount its bind mount the agent gets as --cgroup-root.
	cgroupRoot, cgroup, cgroupMount string
}

// ciliumAssets finds the agent and cilium-dbg (building the tool group when needed) and the
// module's folder (its bpf/ sources and CRDs).
func ciliumAssets() (bin, module string, err error) {
	// Another build of Cilium (another release, a patched one): a folder with cilium-agent and
	// cilium-dbg, and the folder of its module (bpf/, the CRDs).
	if bin, module = os.Getenv("SWH_CILIUM_BIN"), os.Getenv("SWH_CILIUM_MODULE"); bin != "" || module != "" {
		if bin == "" || module == "" {
			return "", "", errors.New("set both SWH_CILIUM_BIN (cilium-agent, cilium-dbg) and SWH_CILIUM_MODULE (its module's folder), or neither")
		}
		return bin, module, nil
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", "", err
	}
	script := filepath.Join(root, "tools", "build.sh")
	if out, err := exec.Command(script, "cilium").CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("tools/build.sh cilium: %w: %s", err, bytes.TrimSpace(out))
	}
	out, err := exec.Command(script, "--dir", "cilium").Output()
	if err != nil {
		return "", "", fmt.Errorf("tools/build.sh --dir cilium: %w", err)
	}
	bin = strings.TrimSpace(string(out))
	list := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", ciliumModule)
	list.Dir = filepath.Join(root, "tools", "cilium")
	list.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	out, err = list.Output()
	if err != nil {
		return "", "", fmt.Errorf("finding %s in the module cache (go list -m in tools/cilium): %w", ciliumModule, err)
	}
	module = strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(module, "bpf", "bpf_sock.c")); err != nil {
		return "", "", fmt.Errorf("cilium's datapath sources are missing: %w", err)
	}
	return bin, module, nil
}

// ciliumCRDPaths are the folders of the CRDs cilium-agent waits for.
func ciliumCRDPaths(module string) []string {
	base := filepath.Join(module, "pkg", "k8s", "apis", "cilium.io", "client", "crds")
	return []string{filepath.Join(base, "v2"), filepath.Join(base, "v2alpha1")}
}

// findClang returns a clang new enough for Cilium's datapath.
func findClang() (string, error) {
	for _, name := range ciliumClangs {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no clang >= 18.1 found (tried %v): Cilium compiles its datapath with it; run `hack/deps.sh --cilium` (Debian 12: clang-19)", ciliumClangs)
}

// startCilium starts cilium-agent at place as node's datapath (kube-proxy replacement; in the
// cluster namespace with the socket load balancer confined to a cgroup of this test binary)
// and waits until it is ready (waitReady).
func startCilium(ctx context.Context, env *controlplane.Env, node NodeInfo, place ciliumPlace, module, bin string, out io.Writer) (ca *ciliumAgent, err error) {
	clang, err := findClang()
	if err != nil {
		return nil, err
	}
	dir, err := tempDirs.make("swh-cilium-" + node.Name + "-")
	if err != nil {
		return nil, err
	}
	ca = &ciliumAgent{place: place, dir: dir, dbg: filepath.Join(bin, "cilium-dbg"), socket: filepath.Join(dir, "run", "cilium.sock")}
	defer func() {
		if err != nil && ca.proc == nil {
			_ = ca.stop()
			ca = nil
		}
	}()
	for _, d := range []string{"run", "state", "lib", "path", "cgroup", "cgroup2"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return ca, fmt.Errorf("creating cilium's folders: %w", err)
		}
	}
	// lib-dir/bpf is where the agent reads the datapath's sources from; it compiles into
	// state-dir, so the read-only module cache serves.
	if err := os.Symlink(filepath.Join(module, "bpf"), filepath.Join(dir, "lib", "bpf")); err != nil {
		return ca, fmt.Errorf("linking cilium's datapath sources: %w", err)
	}
	if err := os.Symlink(clang, filepath.Join(dir, "path", "clang")); err != nil {
		return ca, fmt.Errorf("linking clang: %w", err)
	}
	xtablesLib, err := linkPrivateIptables(toolsCache(), filepath.Join(dir, "path"))
	if err != nil {
		return ca, err
	}
	if place.netns == "" {
		if ca.tablesBefore, err = nftTables(); err != nil {
			return ca, err
		}
	}
	if err := ca.confineSocketLB(); err != nil {
		return ca, err
	}
	kubeconfig, err := env.WriteKubeConfig(dir)
	if err != nil {
		return ca, err
	}
	args := append([]string{"--mount", "--propagation", "private", "--", "sh", "-c", ciliumAgentScript, "sh",
		filepath.Join(bin, "cilium-agent")}, ciliumAgentArgs(dir, kubeconfig, place)...)
	cmd := exec.Command("unshare", args...)
	if place.netns != "" {
		// nsenter joins the node's network namespace and becomes unshare (same PID).
		cmd = exec.Command("nsenter", append([]string{"--net=" + place.netns, "--", "unshare"}, args...)...)
	}
	cmd.Env = append(os.Environ(),
		"PATH="+filepath.Join(dir, "path")+":"+os.Getenv("PATH"),
		"XTABLES_LIBDIR="+xtablesLib,
		"K8S_NODE_NAME="+node.Name,
		"CILIUM_K8S_NAMESPACE=kube-system",
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	opts := process.Options{Grace: 10 * time.Second, Group: true}
	if out == nil && os.Getenv("SWH_TEST_CILIUM_OUTPUT") == "1" {
		out = os.Stderr
	}
	if out != nil {
		cmd.Stdout, cmd.Stderr = out, out
	} else {
		opts.LogFile = filepath.Join(dir, "cilium-agent.log")
	}
	if ca.proc, err = process.Start("cilium-agent", cmd, opts); err != nil {
		return ca, err
	}
	waitCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := ca.waitReady(waitCtx); err != nil {
		return ca, fmt.Errorf("cilium-agent is not ready: %w; its log ends with:\n%s", err, ca.log(8000))
	}
	return ca, nil
}

// ciliumAgentArgs is the smallest configuration that is still what a Deckhouse cluster with
// cni-cilium runs: kube-proxy replacement (socket LB, node ports, health check node ports),
// native routing, IPAM from the Node's podCIDR, no Hubble, no Envoy or L7 proxy, no policy
// enforcement, no iptables rules or masquerading, only the gateway link as its device.
func ciliumAgentArgs(dir, kubeconfig string, place ciliumPlace) []string {
	args := []string{
		"--k8s-kubeconfig-path=" + kubeconfig,
		"--kube-proxy-replacement=true",
		"--bpf-lb-sock=" + strconv.FormatBool(place.socketLB),
		"--routing-mode=native",
		"--ipv4-native-routing-cidr=" + ciliumNativeRoutingCIDR,
		"--ipam=kubernetes",
		"--enable-ipv4=true",
		"--enable-ipv6=" + strconv.FormatBool(place.ipv6),
		"--devices=" + strings.Join(append([]string{place.device}, place.moreDevices...), ","),
		"--direct-routing-device=" + place.device,
		"--enable-ipv4-masquerade=false",
		"--enable-bpf-masquerade=false",
		"--enable-l7-proxy=false",
		"--enable-envoy-config=false",
		"--enable-hubble=false",
		"--enable-policy=never",
		"--enable-health-checking=false",
		"--enable-endpoint-health-checking=false",
		"--identity-allocation-mode=crd",
		"--cni-exclusive=false",
		"--enable-gops=false",
		"--state-dir=" + filepath.Join(dir, "state"),
		"--lib-dir=" + filepath.Join(dir, "lib"),
		"--socket-path=" + filepath.Join(dir, "run", "cilium.sock"),
		"--bpf-root=/sys/fs/bpf",
		"--cgroup-root=" + filepath.Join(dir, "cgroup"),
		"--k8s-require-ipv4-pod-cidr=true",
	}
	if place.ipv6 {
		args = append(args,
			"--ipv6-native-routing-cidr="+ciliumNativeRoutingCIDR6,
			"--enable-ipv6-masquerade=false",
			"--k8s-require-ipv6-pod-cidr=true",
		)
	}
	return args
}

// waitReady polls the agent over its socket until `cilium-dbg status --brief` says OK and its
// host endpoint is "ready": the agent answers OK before its host datapath (bpf_host on the
// devices: node ports, the reverse translation of replies) is compiled and attached, which
// the host endpoint's first regeneration does.
func (ca *ciliumAgent) waitReady(ctx context.Context) error {
	var last string
	for {
		if ca.proc.Exited() {
			return fmt.Errorf("cilium-agent exited: %s", ca.proc.ExitText())
		}
		out, err := exec.CommandContext(ctx, ca.dbg, "-H", "unix://"+ca.socket, "status", "--brief").CombinedOutput()
		last = strings.TrimSpace(string(out))
		if err == nil && last == "OK" {
			var state string
			if state, err = ca.hostEndpointState(ctx); err == nil && state == "ready" {
				return nil
			}
			last = fmt.Sprintf("status OK, host endpoint %q (%v)", state, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last status: %s)", ctx.Err(), last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// hostEndpointState is the state of the agent's host endpoint (label reserved:host).
func (ca *ciliumAgent) hostEndpointState(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, ca.dbg, "-H", "unix://"+ca.socket, "endpoint", "list", "-o", "json").Output()
	if err != nil {
		return "", fmt.Errorf("cilium-dbg endpoint list: %w", err)
	}
	var eps []struct {
		Status struct {
			State    string `json:"state"`
			Identity struct {
				Labels []string `json:"labels"`
			} `json:"identity"`
		} `json:"status"`
	}
	if err := json.Unmarshal(out, &eps); err != nil {
		return "", fmt.Errorf("parsing cilium-dbg endpoint list: %w", err)
	}
	for _, ep := range eps {
		if slices.Contains(ep.Status.Identity.Labels, "reserved:host") {
			return ep.Status.State, nil
		}
	}
	return "", errors.New("no host endpoint yet")
}

// dbgInAgent runs cilium-dbg inside the agent's mount namespace, where its bpffs is.
func (ca *ciliumAgent) dbgInAgent(ctx context.Context, args ...string) ([]byte, error) {
	full := append([]string{"--mount=/proc/" + strconv.Itoa(ca.proc.PID()) + "/ns/mnt", "--", ca.dbg}, args...)
	out, err := exec.CommandContext(ctx, "nsenter", full...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("cilium-dbg %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(ee.Stderr))
		}
		return nil, fmt.Errorf("cilium-dbg %s: %w", strings.Join(args, " "), err)
	}
	return out, nil
}

// log is the end of the agent's log.
func (ca *ciliumAgent) log(limit int64) string {
	if ca.proc != nil && ca.proc.Output(limit) != "" {
		return ca.proc.Output(limit)
	}
	return process.Tail(filepath.Join(ca.dir, "cilium-agent.log"), limit)
}

// ciliumLinks are the links cilium-agent makes in its network namespace and leaves there.
var ciliumLinks = []string{"cilium_host", "cilium_net", "cilium_vxlan", "cilium_geneve"}

// stop ends the agent (SIGTERM, SIGKILL after 10 s; its bpffs and pins go with its mount
// namespace), deletes the links it made in the cluster namespace, gives the cgroup back and
// removes its files.
func (ca *ciliumAgent) stop() error {
	var errs []error
	if ca.proc != nil {
		_ = ca.proc.Stop()
	}
	var links []string
	if ca.place.netns == "" {
		// A node's namespace goes with its links when the node is removed.
		var err error
		if links, err = linkNames(""); err != nil {
			errs = append(errs, err)
		}
	}
	for _, l := range links {
		for _, c := range ciliumLinks {
			if l == c {
				if err := ip("link", "del", l); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
					errs = append(errs, err)
				}
			}
		}
	}
	if ca.tablesBefore != nil {
		if err := deleteNewNftTables(ca.tablesBefore); err != nil {
			errs = append(errs, err)
		}
	}
	if err := ca.releaseCgroup(); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(ca.dir); err != nil {
		errs = append(errs, fmt.Errorf("removing cilium's folder: %w", err))
	}
	return errors.Join(errs...)
}

// installCiliumCRDs installs Cilium's CRDs into a running control plane (a cluster given Env).
func installCiliumCRDs(env *controlplane.Env, module string) error {
	_, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{Paths: ciliumCRDPaths(module), ErrorIfPathMissing: true})
	if err != nil {
		return fmt.Errorf("installing cilium's CRDs: %w", err)
	}
	return nil
}
