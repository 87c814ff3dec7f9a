// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

// PodSpec describes a pod to add.
type PodSpec struct {
	// Namespace and Name of the Pod object.
	Namespace, Name string
	// Node is the name of one of the cluster's nodes (spec.nodeName); empty means the first.
	Node string
	// Labels of the Pod object.
	Labels map[string]string
	// ContainerPorts of the pod's one container ("app").
	ContainerPorts []corev1.ContainerPort
	// NotReady starts the pod with Ready=False (the zero value is a ready, running pod).
	NotReady bool
	// ObjectOnly creates only the Pod object with an address, no network namespace: for tests
	// that need many pods and never connect to them.
	ObjectOnly bool
	// IPFamilies are the pod's address families, primary first (status.podIP is the first):
	// nil gives the cluster's, IPv4 then IPv6 in a dual-stack cluster; [IPv6] makes an
	// IPv6-only pod, [IPv4] an IPv4-only one. IPv6 needs Options.DualStack.
	IPFamilies []corev1.IPFamily
}

// Pod is a pod of the test cluster: a network namespace (unless ObjectOnly) joined to the
// cluster namespace by a veth pair, and a Pod object that names its address.
type Pod struct {
	// Namespace and Name of the Pod object.
	Namespace, Name string
	// Node is the node the pod runs on.
	Node string
	// IP is the pod's address (status.podIP): its primary one.
	IP netip.Addr
	// IPs are all its addresses, one per family, primary first (status.podIPs).
	IPs []netip.Addr
	// Netns is the name of the pod's network namespace (`ip netns exec`/`ip -n`); empty for an
	// ObjectOnly pod.
	Netns string
	// HostLink is the cluster-side end of the pod's veth pair (the node-side end, in the node's
	// namespace, with Options.NodeKubeProxies).
	HostLink string

	c        *Cluster
	zone     string
	nodeNet  *nodeNet // the node's own network (Options.NodeKubeProxies); nil without
	mu       sync.Mutex
	servers  map[*Server]struct{}
	procs    map[*exec.Cmd]*process.Process
	removed  bool
	removeMu sync.Mutex
	// gone is set when removal starts; servers refuse to start from then on.
	gone atomic.Bool
}

// Key is "namespace/name", the way servers name the pod in their replies.
func (p *Pod) Key() string { return p.Namespace + "/" + p.Name }

// NetnsPath is the path of the pod's network namespace, for setns(2) or `nsenter --net=`.
func (p *Pod) NetnsPath() string { return filepath.Join(netnsDir, p.Netns) }

// AddPod creates the pod's network namespace and address first (anything may dial the address
// once the object names it), then its Pod object with status written through the status
// subresource: Running, podIP, Ready as asked. The pod is removed when the test ends: its
// servers and processes stop, the object is deleted, then its namespace and links go.
func (c *Cluster) AddPod(t testing.TB, spec PodSpec) *Pod {
	t.Helper()
	p, err := c.NewPod(t.Context(), spec)
	if err != nil {
		t.Fatalf("adding pod %s/%s: %v", spec.Namespace, spec.Name, err)
	}
	t.Cleanup(func() {
		if err := p.remove(context.Background()); err != nil {
			t.Errorf("removing pod %s: %v", p.Key(), err)
		}
	})
	return p
}

// NewPod is AddPod without a test: the caller removes the pod with Remove (or Cluster.Stop
// does).
func (c *Cluster) NewPod(ctx context.Context, spec PodSpec) (p *Pod, err error) {
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
	podIPs, err := c.podIPs(spec)
	if err != nil {
		return nil, err
	}
	p = &Pod{
		Namespace: spec.Namespace, Name: spec.Name, Node: spec.Node, IP: podIPs[0], IPs: podIPs,
		c: c, zone: node.Zone, servers: map[*Server]struct{}{}, procs: map[*exec.Cmd]*process.Process{},
	}
	c.mu.Lock()
	c.pods[p] = struct{}{}
	c.mu.Unlock()
	defer func() {
		if err != nil {
			if rerr := p.remove(context.Background()); rerr != nil {
				err = fmt.Errorf("%w (and cleaning up: %w)", err, rerr)
			}
		}
	}()
	if nn := c.nodeNet(spec.Node); nn != nil && !spec.ObjectOnly {
		if err := p.createNetworkOnNode(nn); err != nil {
			return p, err
		}
	} else if !spec.ObjectOnly {
		if err := p.createNetwork(); err != nil {
			return p, err
		}
	}
	if err := p.createObject(ctx, spec, node); err != nil {
		return p, err
	}
	return p, nil
}

// createNetwork makes the namespace, the veth pair ("eth0" in the pod), the pod's address, its
// routes (default via the cluster namespace's address) and the host route to the pod.
func (p *Pod) createNetwork() error {
	n := alloc.next()
	netns := namePrefix() + "p" + strconv.Itoa(n)
	link := "swhp" + strconv.Itoa(n)
	if err := ip("netns", "add", netns); err != nil {
		return err
	}
	p.Netns = netns
	if err := ipBatch("", []string{
		"link add " + link + " type veth peer name eth0 netns " + netns,
	}); err != nil {
		return err
	}
	p.HostLink = link
	if err := ipBatch(netns, p.podNetnsCommands()); err != nil {
		return err
	}
	return ipBatch("", p.hostLinkCommands(link))
}

func (p *Pod) createObject(ctx context.Context, spec PodSpec, node *NodeInfo) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, Labels: spec.Labels},
		Spec: corev1.PodSpec{
			NodeName: p.Node,
			Containers: []corev1.Container{{
				Name:  "app",
				Image: "testkit.invalid/pod:latest",
				Ports: spec.ContainerPorts,
			}},
		},
	}
	if err := p.c.Env.Client.Create(ctx, pod); err != nil {
		return fmt.Errorf("creating Pod %s: %w", p.Key(), err)
	}
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase:     corev1.PodRunning,
		HostIP:    node.IP.String(),
		HostIPs:   hostIPList(node),
		PodIP:     p.IP.String(),
		PodIPs:    p.podIPList(),
		StartTime: &now,
		QOSClass:  corev1.PodQOSBestEffort,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name:        "app",
			Image:       "testkit.invalid/pod:latest",
			ImageID:     "testkit.invalid/pod@sha256:0000000000000000000000000000000000000000000000000000000000000000",
			ContainerID: "testkit://" + p.Netns,
			Started:     ptr.To(true),
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		}},
	}
	setReady(&pod.Status, !spec.NotReady, now)
	if err := p.c.Env.Client.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("writing the status of Pod %s: %w", p.Key(), err)
	}
	return nil
}

// setReady sets the Ready and ContainersReady conditions and the container's ready flag.
func setReady(st *corev1.PodStatus, ready bool, now metav1.Time) {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	for _, typ := range []corev1.PodConditionType{corev1.ContainersReady, corev1.PodReady} {
		found := false
		for i := range st.Conditions {
			if st.Conditions[i].Type == typ {
				found = true
				if st.Conditions[i].Status != status {
					st.Conditions[i].Status = status
					st.Conditions[i].LastTransitionTime = now
				}
			}
		}
		if !found {
			st.Conditions = append(st.Conditions, corev1.PodCondition{Type: typ, Status: status, LastTransitionTime: now})
		}
	}
	for i := range st.ContainerStatuses {
		st.ContainerStatuses[i].Ready = ready
	}
}

// Object reads the pod's current Pod object.
func (p *Pod) Object(ctx context.Context) (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	if err := p.c.Env.Client.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, pod); err != nil {
		return nil, fmt.Errorf("reading Pod %s: %w", p.Key(), err)
	}
	return pod, nil
}

// SetReady writes the pod's Ready condition (and ContainersReady, the container's ready flag)
// through the status subresource, the way a kubelet does.
func (p *Pod) SetReady(t testing.TB, ready bool) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := p.Object(t.Context())
		if err != nil {
			return err
		}
		setReady(&pod.Status, ready, metav1.Now())
		return p.c.Env.Client.Status().Update(t.Context(), pod)
	})
	if err != nil {
		t.Fatalf("setting pod %s ready=%v: %v", p.Key(), ready, err)
	}
}

// MarkTerminating starts a graceful deletion with a long grace period: the Pod object gets its
// deletionTimestamp and stays (no kubelet finishes it) until Delete; its network and servers
// keep running, like a pod that drains.
func (p *Pod) MarkTerminating(t testing.TB) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
	if err := p.c.Env.Client.Delete(t.Context(), pod, client.GracePeriodSeconds(3600)); err != nil {
		t.Fatalf("marking pod %s terminating: %v", p.Key(), err)
	}
	got, err := p.Object(t.Context())
	if err != nil {
		t.Fatalf("marking pod %s terminating: %v", p.Key(), err)
	}
	if got.DeletionTimestamp == nil {
		t.Fatalf("pod %s has no deletionTimestamp after a graceful delete", p.Key())
	}
}

// Delete removes the pod now: servers and processes stop, the Pod object is deleted (grace
// period 0) and gone, then the network namespace and its links are removed.
func (p *Pod) Delete(t testing.TB) {
	t.Helper()
	if err := p.remove(t.Context()); err != nil {
		t.Fatalf("deleting pod %s: %v", p.Key(), err)
	}
}

// Remove is Delete without a test, for pods made by NewPod.
func (p *Pod) Remove(ctx context.Context) error { return p.remove(ctx) }

// remove is idempotent. Order: stop what listens in the namespace, delete the object and wait
// until it is gone, then remove the namespace and the veth pair.
func (p *Pod) remove(ctx context.Context) error {
	p.removeMu.Lock()
	defer p.removeMu.Unlock()
	if p.removed {
		return nil
	}
	p.gone.Store(true)
	var errs []error
	p.mu.Lock()
	servers := make([]*Server, 0, len(p.servers))
	for s := range p.servers {
		servers = append(servers, s)
	}
	procs := make([]*process.Process, 0, len(p.procs))
	for _, proc := range p.procs {
		procs = append(procs, proc)
	}
	p.mu.Unlock()
	for _, s := range servers {
		s.Stop()
	}
	for _, proc := range procs {
		_ = proc.Stop() // one that had to be killed has still stopped
	}
	if p.c.Env != nil {
		if err := p.deleteObject(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	// The host end first: deleting it removes the pair at once, while a deleted namespace
	// takes its links down later, in the background.
	if p.nodeNet != nil {
		if err := p.detachFromNode(); err != nil {
			errs = append(errs, err)
		}
	} else if p.HostLink != "" {
		if err := ip("link", "del", p.HostLink); err != nil && !isNoDevice(err) {
			errs = append(errs, err)
		}
	}
	if p.Netns != "" {
		if err := ip("netns", "del", p.Netns); err != nil && !strings.Contains(err.Error(), "No such file") {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		p.removed = true
		p.c.mu.Lock()
		delete(p.c.pods, p)
		p.c.mu.Unlock()
	}
	return errors.Join(errs...)
}

func isNoDevice(err error) bool {
	return strings.Contains(err.Error(), "Cannot find device") || strings.Contains(err.Error(), "No such device")
}

func (p *Pod) deleteObject(ctx context.Context) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
	if err := p.c.Env.Client.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil && !isNotFound(err) {
		return fmt.Errorf("deleting Pod %s: %w", p.Key(), err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := p.c.Env.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod)
		if isNotFound(err) {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("pod %s: reading it 30 s after its deletion: %w", p.Key(), err)
			}
			return fmt.Errorf("pod %s still exists 30 s after its deletion", p.Key())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Endpoint is an EndpointSlice endpoint for the pod: its address, nodeName, zone, targetRef and
// the conditions given.
func (p *Pod) Endpoint(conds discoveryv1.EndpointConditions) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{
		Addresses:  []string{p.IP.String()},
		Conditions: conds,
		NodeName:   ptr.To(p.Node),
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name},
	}
	if p.zone != "" {
		ep.Zone = ptr.To(p.zone)
	}
	return ep
}

// InNetns runs fn on an OS thread inside the pod's network namespace: sockets fn creates (a
// listener, a client connection) belong to the pod for their whole life. fn must not start
// goroutines that expect to be in the pod.
func (p *Pod) InNetns(fn func() error) error {
	if p.Netns == "" {
		return fmt.Errorf("pod %s has no network namespace (ObjectOnly)", p.Key())
	}
	return inNetns(p.NetnsPath(), fn)
}

// CommandPrefix is the argv prefix that runs a program inside the pod's network namespace
// ("nsenter --net=<path> --"), for harnesses that build their own commands.
func (p *Pod) CommandPrefix() []string {
	return []string{"nsenter", "--net=" + p.NetnsPath(), "--"}
}

// Command prepares a command that runs inside the pod's network namespace (through nsenter).
// Start it with StartProcess so it is stopped with the pod; set Env, Dir, output as needed.
func (p *Pod) Command(name string, args ...string) *exec.Cmd {
	argv := append(p.CommandPrefix(), name)
	cmd := exec.Command(argv[0], append(argv[1:], args...)...)
	// Its own process group, so stopping reaches its children (runuser, shells); killed if the
	// test process dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// Run starts name with args inside the pod's network namespace, its output going to the test
// log; it is stopped (SIGTERM to its process group, SIGKILL after 10 s) when the pod is removed
// or the test ends, or by StopProcess.
func (p *Pod) Run(t testing.TB, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := p.Command(name, args...)
	w := &testLogWriter{t: t, prefix: p.Key() + ": "}
	cmd.Stdout, cmd.Stderr = w, w
	p.StartProcess(t, cmd)
	return cmd
}

// StartProcess starts a command made by Command and stops it with the pod or at the end of the
// test, whichever comes first. Output the command does not send elsewhere is discarded.
func (p *Pod) StartProcess(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	if p.Netns == "" {
		t.Fatalf("pod %s has no network namespace (ObjectOnly)", p.Key())
	}
	if cmd.Stdout == nil && cmd.Stderr == nil {
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	}
	proc, err := process.Start(fmt.Sprintf("%v in pod %s", cmd.Args, p.Key()), cmd, process.Options{Grace: 10 * time.Second, Group: true})
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.procs[cmd] = proc
	p.mu.Unlock()
	t.Cleanup(func() { p.StopProcess(cmd) })
}

// StopProcess stops a process started in the pod (SIGTERM to its process group, SIGKILL after
// 10 s) and waits for it.
func (p *Pod) StopProcess(cmd *exec.Cmd) {
	p.mu.Lock()
	proc, ok := p.procs[cmd]
	delete(p.procs, cmd)
	p.mu.Unlock()
	if ok {
		_ = proc.Stop()
	}
}

// testLogWriter sends lines to t.Log while the test runs.
type testLogWriter struct {
	t      testing.TB
	prefix string
	mu     sync.Mutex
}

var _ io.Writer = (*testLogWriter)(nil)

func (w *testLogWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	defer func() { _ = recover() }() // t.Log after the test ended panics
	w.t.Log(w.prefix + string(b))
	return len(b), nil
}
