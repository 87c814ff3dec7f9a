// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/loopback"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

// kubeProxyTables are the nftables tables kube-proxy's nftables mode owns.
var kubeProxyTables = [][2]string{{"ip", "kube-proxy"}, {"ip6", "kube-proxy"}}

// kubeProxy is a running kube-proxy.
type kubeProxy struct {
	proc *process.Process
	dir  string
	// metrics is the address of its metrics ("127.0.0.1:port").
	metrics string
}

// kubeProxyConfigCommon ends both kube-proxy configurations (kubeProxyConfig and
// nodeKubeProxyConfig): no conntrack sysctl writes, a short minimum sync period, no OOM score
// change, verbosity 2.
const kubeProxyConfigCommon = `conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
nftables:
  minSyncPeriod: 100ms
  syncPeriod: 30s
oomScoreAdj: 0
logging:
  verbosity: 2
`

// kubeProxyConfig is kube-proxy's configuration: nftables mode, acting as node, ports bound to
// 127.0.0.1, no conntrack sysctl writes (the limits are global or the machine's business), a
// short minimum sync period so tests see slice changes quickly.
const kubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: %q
clientConnection:
  kubeconfig: %q
  qps: 100
  burst: 200
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
` + kubeProxyConfigCommon

func startKubeProxy(ctx context.Context, env *controlplane.Env, node string, out io.Writer) (*kubeProxy, error) {
	bin, err := controlplane.Binary("kube-proxy")
	if err != nil {
		return nil, err
	}
	dir, err := tempDirs.make("swh-kube-proxy-")
	if err != nil {
		return nil, err
	}
	kubeconfig, err := env.WriteKubeConfig(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	healthz, err := loopback.FreePort()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	metrics, err := loopback.FreePort()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, kubeProxyConfig, node, kubeconfig, healthz, metrics), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("writing kube-proxy's config: %w", err)
	}
	if out == nil && os.Getenv("SWH_TEST_KUBEPROXY_OUTPUT") == "1" {
		out = os.Stderr
	}
	cmd := exec.Command(bin, "--config", cfgPath)
	opts := process.Options{Grace: 10 * time.Second, Group: true}
	if out != nil {
		cmd.Stdout, cmd.Stderr = out, out
	} else {
		opts.LogFile = filepath.Join(dir, "kube-proxy.log")
	}
	// Killed if the test process dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	proc, err := process.Start("kube-proxy", cmd, opts)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	kp := &kubeProxy{proc: proc, dir: dir, metrics: fmt.Sprintf("127.0.0.1:%d", metrics)}
	// healthz answers 200 once kube-proxy has found its Node and written its rules.
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := proc.WaitHTTP(waitCtx, fmt.Sprintf("http://127.0.0.1:%d/healthz", healthz)); err != nil {
		if proc.Exited() {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("kube-proxy exited during start: %w", err)
		}
		return kp, fmt.Errorf("kube-proxy is not healthy after a minute: %w; its output ends with:\n%s", err, proc.Output(4000))
	}
	return kp, nil
}

// stop ends kube-proxy (SIGTERM to its process group, then SIGKILL after 10 s), deletes its
// nftables tables (it leaves them behind on exit) and removes its files.
func (kp *kubeProxy) stop() error {
	var errs []error
	_ = kp.proc.Stop() // a kube-proxy that had to be killed has still stopped
	for _, tbl := range kubeProxyTables {
		out, err := exec.Command("nft", "delete", "table", tbl[0], tbl[1]).CombinedOutput()
		if err != nil && !bytes.Contains(out, []byte("No such file or directory")) {
			errs = append(errs, fmt.Errorf("deleting nftables table %s %s: %w: %s", tbl[0], tbl[1], err, bytes.TrimSpace(out)))
		}
	}
	_ = os.RemoveAll(kp.dir)
	return errors.Join(errs...)
}

// programmedPort reads the Service "namespace/name" and finds its port number port, for the
// readers of kube-proxy's rules (ProgrammedEndpoints, ProgrammedEndpointsOf); it fails when the
// cluster runs no kube-proxy.
func (c *Cluster) programmedPort(ctx context.Context, service string, port int32) (types.NamespacedName, *corev1.Service, *corev1.ServicePort, error) {
	if c.kubeProxy == nil && c.cilium == nil {
		return types.NamespacedName{}, nil, nil, errors.New("this cluster runs no kube-proxy (Options.KubeProxy) and no cilium-agent (Options.Cilium)")
	}
	key, err := splitKey(service)
	if err != nil {
		return types.NamespacedName{}, nil, nil, err
	}
	svc := &corev1.Service{}
	if err := c.Env.Client.Get(ctx, key, svc); err != nil {
		return types.NamespacedName{}, nil, nil, fmt.Errorf("reading Service %s: %w", service, err)
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Port == port {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil {
		return types.NamespacedName{}, nil, nil, fmt.Errorf("service %s has no port %d", service, port)
	}
	return key, svc, sp, nil
}

// ProgrammedEndpoints returns the endpoints ("ip:port", sorted) that kube-proxy's nftables rules
// (with Options.Cilium: the slots of cilium-agent's BPF service map, see ciliumlb.go)
// currently send NEW connections to for the Service "namespace/name" and its port number port,
// from the cluster namespace (ClusterIP traffic, the internal traffic policy as seen by
// kube-proxy's node). It reads kube-proxy's own rules, so it shows what kube-proxy made of the
// EndpointSlices: only ready endpoints, or the serving terminating ones when none is ready. No
// rules means none.
func (c *Cluster) ProgrammedEndpoints(ctx context.Context, service string, port int32) ([]string, error) {
	key, svc, sp, err := c.programmedPort(ctx, service, port)
	if err != nil {
		return nil, err
	}
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil, fmt.Errorf("service %s has no ClusterIP", service)
	}
	proto := strings.ToLower(string(sp.Protocol))
	if c.cilium != nil {
		return c.cilium.ciliumProgrammed(ctx, svc.Spec.ClusterIP, port, proto)
	}
	base := fmt.Sprintf("%s/%s/%s/%s", key.Namespace, key.Name, proto, sp.Name)
	// `nft list chains <family> <table>` is newer than the nftables here: list the table.
	table, err := exec.CommandContext(ctx, "nft", "list", "table", "ip", "kube-proxy").CombinedOutput()
	if err != nil {
		if bytes.Contains(table, []byte("No such file or directory")) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing kube-proxy's table: %w: %s", err, bytes.TrimSpace(table))
	}
	// The map service-ips sends "ClusterIP . proto . port" to the chain of the internal traffic
	// policy ("service-HASH-ns/name/proto/port" for Cluster, "local-..." for Local); no element
	// means no endpoints (the packet goes to the no-endpoint reject instead).
	elemRE := regexp.MustCompile(regexp.QuoteMeta(svc.Spec.ClusterIP) + ` \. ` + proto + ` \. ` +
		strconv.Itoa(int(port)) + ` : goto ([A-Za-z0-9_./-]+)`)
	em := elemRE.FindSubmatch(table)
	if em == nil {
		return nil, nil
	}
	chainRE := regexp.MustCompile(`(?m)^\tchain ` + regexp.QuoteMeta(string(em[1])) + ` \{\n`)
	loc := chainRE.FindIndex(table)
	if loc == nil {
		return nil, nil
	}
	rules := table[loc[1]:]
	if end := bytes.Index(rules, []byte("\n\t}")); end >= 0 {
		rules = rules[:end]
	}
	// The chain dispatches in one of three shapes: "dnat to IP:PORT" (one endpoint), "dnat ip to
	// numgen random mod N map { 0 : IP . PORT, ... }" (several), or "goto endpoint-HASH-...__IP/PORT"
	// (session affinity).
	seen := map[string]bool{}
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`dnat to ([0-9.]+):([0-9]+)`),
		regexp.MustCompile(`[0-9]+ : ([0-9.]+) \. ([0-9]+)`),
		regexp.MustCompile(`goto endpoint-[A-Z0-9]{8}-` + regexp.QuoteMeta(base) + `__([0-9.]+)/([0-9]+)`),
	} {
		for _, em := range re.FindAllSubmatch(rules, -1) {
			seen[net.JoinHostPort(string(em[1]), string(em[2]))] = true
		}
	}
	eps := make([]string, 0, len(seen))
	for ep := range seen {
		eps = append(eps, ep)
	}
	sort.Strings(eps)
	return eps, nil
}

// WaitProgrammed waits (up to a minute) until kube-proxy (or cilium-agent, Options.Cilium) sends new connections for the
// Service "namespace/name" port to exactly the given pods (by address; no pods: to nobody).
// Call it after writing EndpointSlices and before sending traffic.
func (c *Cluster) WaitProgrammed(t testing.TB, service string, port int32, pods ...*Pod) {
	t.Helper()
	want := make([]string, 0, len(pods))
	for _, p := range pods {
		want = append(want, p.IP.String())
	}
	sort.Strings(want)
	deadline := time.Now().Add(time.Minute)
	var last []string
	var lastErr error
	for {
		eps, err := c.ProgrammedEndpoints(t.Context(), service, port)
		last, lastErr = nil, err
		for _, ep := range eps {
			h, _, _ := net.SplitHostPort(ep)
			last = append(last, h)
		}
		sort.Strings(last)
		if err == nil && slices.Equal(last, want) {
			return
		}
		if time.Now().After(deadline) || t.Context().Err() != nil {
			if c.cilium != nil {
				t.Fatalf("cilium-agent did not program %s port %d to %v within a minute: its maps give new connections to %v (last error: %v); they hold:\n%s",
					service, port, want, last, lastErr, c.cilium.ciliumDump(context.Background()))
			}
			table, _ := exec.Command("nft", "list", "table", "ip", "kube-proxy").CombinedOutput()
			if len(table) > 6000 {
				table = table[:6000]
			}
			t.Fatalf("kube-proxy did not program %s port %d to %v within a minute: it has %v (last error: %v); its table:\n%s",
				service, port, want, last, lastErr, table)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// splitKey parses "namespace/name".
func splitKey(s string) (types.NamespacedName, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" {
		return types.NamespacedName{}, fmt.Errorf("%q is not namespace/name", s)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

// KubeProxyMetrics is the address of kube-proxy's metrics ("127.0.0.1:port"; "" when the
// cluster runs no kube-proxy in its namespace), for tests that read what kube-proxy measured
// (kubeproxy_network_programming_duration_seconds).
func (c *Cluster) KubeProxyMetrics() string {
	if c.kubeProxy == nil {
		return ""
	}
	return c.kubeProxy.metrics
}

// KubeProxyPID is the process id of kube-proxy (0 when the cluster runs none), for tests that
// check it is gone.
func (c *Cluster) KubeProxyPID() int {
	if c.kubeProxy == nil {
		return 0
	}
	return c.kubeProxy.proc.PID()
}
