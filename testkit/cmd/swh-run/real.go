// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/postgres"
	"github.com/deckhouse/service-with-healthchecks/testkit/realnode"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

// Values of Config.Nodes (--nodes, make run NODES=...).
const (
	nodesNamespace = "namespace"
	nodesReal      = "real"
)

// realControlPort is the control listener of vm-0's test server (swh-testserver -control).
const realControlPort = 9999

// proxyNode is the simulated node of a real-node demo: kube-proxy runs as it (the harness's
// one kube-proxy in the cluster namespace); no demo pod runs there.
const proxyNode = "node-proxy"

// realSpecs are the real nodes of `make run NODES=real`: real-a on the cluster namespace's own
// address (where the API server advertises itself), real-b on a further address on lo; each
// with its CNI bridge and pod range.
var realSpecs = []realnode.Spec{
	{Name: "real-a", NodeIP: "198.19.0.1", PodCIDR: "198.18.200.0/24", Bridge: "swhcni0"},
	{Name: "real-b", NodeIP: "198.19.0.2", PodCIDR: "198.18.201.0/24", Bridge: "swhcni1"},
}

// realDemo is what a real-node demo adds: the nodes, their folders and the pods' addresses.
type realDemo struct {
	nodes   []*realnode.Node
	dirs    []string // the nodes' state folders and the images' folder, removed at cleanup
	loAddrs []string // addresses added to lo for the nodes
	cluster *cluster.Cluster
	vmIP    string
	podIPs  map[string]string // pod IP -> "demo/name"
}

func (r *realDemo) node(name string) (*realnode.Node, error) {
	for _, n := range r.nodes {
		if n.Name() == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("no real node %q (real nodes: %s)", name, strings.Join(realNodeNames(), ", "))
}

func realNodeNames() []string {
	var out []string
	for _, s := range realSpecs {
		out = append(out, s.Name)
	}
	return out
}

// upReal brings the demo up on real nodes: a cluster whose API server runs the Node
// authorizer and NodeRestriction, two kubelets with containerd, the product with an agent per
// node, vm-0 as a container of the local test server image and the db pods as containers
// whose network namespaces PostgreSQL (a host program, entered with nsenter) listens in.
func (d *demo) upReal(ctx context.Context) error {
	r := &realDemo{podIPs: map[string]string{}}
	d.real = r
	var kubeletDir, toolsDir string
	var archives []string
	if err := d.step("building the kubelet, containerd and the CNI plugins (when the tool cache has none) and the local images", func() (string, error) {
		var err error
		if kubeletDir, err = realnode.ToolDir("node"); err != nil {
			return "", err
		}
		if toolsDir, err = realnode.ToolDir("containerd"); err != nil {
			return "", err
		}
		imgDir, err := os.MkdirTemp("", "swh-run-images-")
		if err != nil {
			return "", err
		}
		r.dirs = append(r.dirs, imgDir)
		archives, err = realnode.BuildImages(imgDir)
		return fmt.Sprintf("the kubelet, containerd and the CNI plugins are in the tool cache; built the local images (%d archives)", len(archives)), err
	}); err != nil {
		return err
	}
	var bins stack.Binaries
	if err := d.step("building the controller and the agent (go build: a minute or two the first time, cached after)", func() (string, error) {
		var err error
		bins, err = stack.Build()
		return "built the controller and the agent", err
	}); err != nil {
		return fmt.Errorf("building the programs: %w", err)
	}
	if err := d.step("starting the API server (Node authorizer, NodeRestriction), etcd and kube-proxy", func() (string, error) {
		c, err := cluster.New(cluster.Options{
			Nodes:     []cluster.Node{{Name: proxyNode, Zone: "zone-a"}},
			KubeProxy: true,
			ControlPlane: controlplane.Options{APIServerFlags: map[string]string{
				"authorization-mode":       "Node,RBAC",
				"enable-admission-plugins": "NodeRestriction",
			}},
		})
		if err != nil {
			return "", fmt.Errorf("starting the cluster: %w", err)
		}
		r.cluster, d.c = c, c
		return "started the API server (Node authorizer, NodeRestriction), etcd and kube-proxy (as node " + proxyNode + ")", nil
	}); err != nil {
		return err
	}
	c := r.cluster
	for _, spec := range realSpecs {
		if err := d.step("starting real node "+spec.Name+" (a kubelet and containerd)", func() (string, error) {
			err := r.startNode(ctx, c, spec, toolsDir, filepath.Join(kubeletDir, "kubelet"), archives)
			return "real node " + spec.Name + " Ready", err
		}); err != nil {
			return err
		}
	}
	if err := d.startPrograms(ctx, stack.Options{Cluster: c, AgentNodes: realNodeNames(), Binaries: &bins}); err != nil {
		return err
	}
	if err := d.step("starting pod "+demoNamespace+"/"+vmPod+" (the kubelet runs a container of "+realnode.TestServerImage+")", func() (string, error) {
		vm, err := r.runPod(ctx, c, realPod(vmPod, realSpecs[0].Name, map[string]string{"vm": "mail-1"}, realnode.TestServerImage,
			[]string{fmt.Sprintf("-control=:%d", realControlPort), fmt.Sprintf("http=:%d", webPort), fmt.Sprintf("smtp=:%d", smtpPort)},
			[]corev1.ContainerPort{{Name: "http", ContainerPort: webPort}, {Name: "smtp", ContainerPort: smtpPort}}))
		if err != nil {
			return "", err
		}
		r.vmIP = vm.Status.PodIP
		return fmt.Sprintf("pod %s/%s on %s (%s): a container of %s, HTTP on %d, SMTP on %d, its control listener on %d",
			demoNamespace, vmPod, vm.Spec.NodeName, r.vmIP, realnode.TestServerImage, webPort, smtpPort, realControlPort), nil
	}); err != nil {
		return err
	}
	if err := d.step("starting pods db-0 and db-1 and PostgreSQL in them", func() (string, error) { return d.startRealDB(ctx, r, c) }); err != nil {
		return err
	}
	if err := d.step("applying the examples", func() (string, error) { return d.apply(ctx, exampleFiles) }); err != nil {
		return err
	}
	d.loops = []*loop{
		d.newLoop("db-read", pgPort, protoPGRead),
		d.newLoop("db-write", pgPort, protoPGWrite),
		d.newLoop("smtp", 25, protoSMTP),
		d.newLoop("web", 80, protoHTTP),
	}
	d.startLoops(ctx)
	return nil
}

// startRealDB runs the db pods (pause containers) on the real nodes and PostgreSQL in their
// network namespaces.
func (d *demo) startRealDB(ctx context.Context, r *realDemo, c *cluster.Cluster) (string, error) {
	var netns [2]string
	var ips [2]string
	for i := range netns {
		spec := realSpecs[i%len(realSpecs)]
		p, err := r.runPod(ctx, c, realPod(fmt.Sprintf("db-%d", i), spec.Name, map[string]string{"app": "db"}, realnode.PauseImage, nil,
			[]corev1.ContainerPort{{Name: "postgres", ContainerPort: pgPort}}))
		if err != nil {
			return "", err
		}
		n, _ := r.node(spec.Name)
		if netns[i], err = n.PodNetns(string(p.UID)); err != nil {
			return "", err
		}
		ips[i] = p.Status.PodIP
	}
	return d.startRealPostgres(ctx, netns, ips)
}

// startNode starts one real node and waits until its Node is Ready.
func (r *realDemo) startNode(ctx context.Context, c *cluster.Cluster, spec realnode.Spec, toolsDir, kubelet string, archives []string) error {
	if spec.NodeIP != realSpecs[0].NodeIP {
		addr := spec.NodeIP + "/32"
		if out, err := exec.Command("ip", "addr", "add", addr, "dev", "lo").CombinedOutput(); err != nil {
			return fmt.Errorf("adding %s to lo: %w: %s", addr, err, out)
		}
		r.loAddrs = append(r.loAddrs, addr)
	}
	kubeconfig, err := c.Env.KubeConfigFor("system:node:"+spec.Name, "system:nodes")
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "swh-run-node-"+spec.Name+"-")
	if err != nil {
		return err
	}
	r.dirs = append(r.dirs, dir)
	n, err := realnode.Start(ctx, realnode.Options{
		Name: spec.Name, NodeIP: spec.NodeIP, PodCIDR: spec.PodCIDR, Bridge: spec.Bridge, Dir: dir,
		ToolsDir: toolsDir, Kubelet: kubelet, Runc: os.Getenv("SWH_REALNODE_RUNC"),
		PauseImage: realnode.PauseImage, Images: archives, KubeConfig: kubeconfig,
	})
	if n != nil {
		r.nodes = append(r.nodes, n) // so the cleanup stops it, also after a failed start
	}
	if err != nil {
		return fmt.Errorf("starting real node %s: %w\n%s", spec.Name, err, n.Logs(8<<10))
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := realnode.WaitReady(wctx, c.Env.Client, spec.Name); err != nil {
		return fmt.Errorf("%w\n%s", err, n.Logs(8<<10))
	}
	return nil
}

// realPod is a demo pod on a real node: one container of image with args, its ports, the
// downward API's name and namespace.
func realPod(name, node string, labels map[string]string, image string, args []string, ports []corev1.ContainerPort) *corev1.Pod {
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	automount := false
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: demoNamespace, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			// No scheduler runs: the pods name their node.
			NodeName:                      node,
			AutomountServiceAccountToken:  &automount,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "main", Image: image, ImagePullPolicy: corev1.PullNever, Args: args, Ports: ports,
				Env: []corev1.EnvVar{
					{Name: "POD_NAME", ValueFrom: field("metadata.name")},
					{Name: "POD_NAMESPACE", ValueFrom: field("metadata.namespace")},
				},
			}},
		},
	}
}

// runPod creates the pod and waits until the kubelet runs it with an IP.
func (r *realDemo) runPod(ctx context.Context, c *cluster.Cluster, pod *corev1.Pod) (*corev1.Pod, error) {
	if err := c.Env.Client.Create(ctx, pod); err != nil {
		return nil, fmt.Errorf("creating pod %s: %w", pod.Name, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		var p corev1.Pod
		err := c.Env.Client.Get(wctx, client.ObjectKeyFromObject(pod), &p)
		if err == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			r.podIPs[p.Status.PodIP] = demoNamespace + "/" + p.Name
			return &p, nil
		}
		select {
		case <-wctx.Done():
			return nil, fmt.Errorf("pod %s did not run on %s: %w (phase %s)", pod.Name, pod.Spec.NodeName, wctx.Err(), p.Status.Phase)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startRealPostgres is startPostgres for the real-node demo: the servers run in the db pods'
// network namespaces.
func (d *demo) startRealPostgres(ctx context.Context, netns, ips [2]string) (string, error) {
	prefix := func(i int) []string { return []string{"nsenter", "--net=" + netns[i], "--"} }
	return d.startPostgresIn(ctx, [2]postgres.Options{
		{ListenAddress: ips[0], CommandPrefix: prefix(0)},
		{ListenAddress: ips[1], CommandPrefix: prefix(1)},
	}, [2]string{realSpecs[0].Name, realSpecs[1].Name})
}

// stop removes what upReal made beyond the stack: the real nodes (their containers, mounts,
// cgroups, bridges), the cluster, the addresses on lo and the folders.
func (r *realDemo) stop() error {
	var errs []error
	for i := len(r.nodes) - 1; i >= 0; i-- {
		if err := r.nodes[i].Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stopping real node %s: %w", r.nodes[i].Name(), err))
		}
	}
	if r.cluster != nil {
		errs = append(errs, r.cluster.Stop())
	}
	for _, addr := range r.loAddrs {
		if out, err := exec.Command("ip", "addr", "del", addr, "dev", "lo").CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("removing %s from lo: %w: %s", addr, err, out))
		}
	}
	for _, dir := range r.dirs {
		errs = append(errs, os.RemoveAll(dir))
	}
	return errors.Join(errs...)
}

// control sends one request to vm-0's test server's control listener.
func (r *realDemo) control(ctx context.Context, path string) error {
	url := "http://" + net.JoinHostPort(r.vmIP, strconv.Itoa(realControlPort)) + path
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("vm-0's control listener: %w", err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("vm-0's control listener: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// killVM kills vm-0's server process (SIGKILL): the container exits, the kubelet restarts it
// in the same pod (same IP).
func (d *demo) killVM(ctx context.Context) (string, error) {
	var p corev1.Pod
	if err := d.c.Env.Client.Get(ctx, client.ObjectKey{Namespace: demoNamespace, Name: vmPod}, &p); err != nil {
		return "", err
	}
	n, err := d.real.node(p.Spec.NodeName)
	if err != nil {
		return "", err
	}
	pids, err := n.PodPIDs(string(p.UID))
	if err != nil {
		return "", err
	}
	for _, pid := range pids {
		cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if strings.HasPrefix(string(cmdline), "/swh-testserver\x00") {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				return "", fmt.Errorf("killing pid %d: %w", pid, err)
			}
			return fmt.Sprintf("vm-0's server process (pid %d) killed; the kubelet restarts the container in the same pod", pid), nil
		}
	}
	return "", errors.New("vm-0's server process is not running (the kubelet is restarting it?)")
}

// realCommands replace or add control commands on real nodes (development/RUN.md): the servers
// of vm-0 are switched through its container's control listener; the kubelets can be stopped.
var realCommands = map[string]command{
	"stop-smtp": {help: "close the SMTP listener inside vm-0's container (connections refused; the container keeps running): vm-0 leaves smtp, stays in web", run: func(ctx context.Context, d *demo, _ string) (string, error) {
		return "SMTP listener of vm-0 closed", d.real.control(ctx, "/smtp/stop")
	}},
	"start-smtp": {help: "open vm-0's SMTP listener again", run: func(ctx context.Context, d *demo, _ string) (string, error) {
		return "SMTP listener of vm-0 open", d.real.control(ctx, "/smtp/start")
	}},
	"wedge-smtp": {help: "wedge vm-0's SMTP server (accepts, never greets): smtp's banner check withdraws vm-0", run: func(ctx context.Context, d *demo, _ string) (string, error) {
		return "SMTP server of vm-0 wedged: it accepts connections and never greets", d.real.control(ctx, "/smtp/wedge")
	}},
	"unwedge-smtp": {help: "make vm-0's SMTP server greet new connections again", run: func(ctx context.Context, d *demo, _ string) (string, error) {
		return "SMTP server of vm-0 greets again", d.real.control(ctx, "/smtp/unwedge")
	}},
	"fail-web": {help: "make vm-0's HTTP server answer 503: vm-0 leaves web, stays in smtp", run: func(ctx context.Context, d *demo, _ string) (string, error) {
		return "HTTP server of vm-0 answers 503", d.real.control(ctx, "/http/status/503")
	}},
	"heal-web": {help: "make vm-0's HTTP server answer 200 again", run: func(ctx context.Context, d *demo, _ string) (string, error) {
		return "HTTP server of vm-0 answers 200", d.real.control(ctx, "/http/status/200")
	}},
	"kill-vm": {help: "SIGKILL vm-0's server process: the kubelet restarts the container (same pod, same IP; back-off after repeats)", run: func(ctx context.Context, d *demo, _ string) (string, error) {
		return d.killVM(ctx)
	}},
	"stop-kubelet": {args: "NODE", help: "stop the kubelet of NODE (SIGTERM; its containers keep running, as on a node whose kubelet died)", run: func(_ context.Context, d *demo, node string) (string, error) {
		n, err := d.real.node(node)
		if err != nil {
			return "", err
		}
		return "kubelet of " + node + " stopped; its containers keep running", n.StopKubelet()
	}},
	"start-kubelet": {args: "NODE", help: "start the kubelet of NODE again", run: func(_ context.Context, d *demo, node string) (string, error) {
		n, err := d.real.node(node)
		if err != nil {
			return "", err
		}
		if n.KubeletPID() != 0 {
			return "", fmt.Errorf("the kubelet of %s runs (pid %d)", node, n.KubeletPID())
		}
		return "kubelet of " + node + " started", n.StartKubelet()
	}},
	"delete-node": {args: "NODE", help: "not on real nodes: the kubelet owns its Node object (use stop-kubelet or stop-agent)", run: func(context.Context, *demo, string) (string, error) {
		return "", errors.New("delete-node is not offered on real nodes: the kubelet registered the Node and would not re-register it, and no pod garbage collector runs; use stop-kubelet NODE or stop-agent NODE")
	}},
}

// realOrder is the order of the real-node commands in the help.
var realOrder = []string{"kill-vm", "stop-kubelet", "start-kubelet"}

// command is the control command of that name: on real nodes realCommands first.
func (d *demo) command(name string) (command, bool) {
	if d.real != nil {
		if c, ok := realCommands[name]; ok {
			return c, true
		}
	}
	c, ok := commands[name]
	return c, ok
}

// help is the help text: on real nodes with the real-node commands and the nodes' names.
func (d *demo) help() string {
	if d.real == nil {
		return helpText()
	}
	var b strings.Builder
	text := helpText()
	text = text[:strings.LastIndex(text, "\n")+1] // without the line of the nodes
	for _, line := range strings.SplitAfter(text, "\n") {
		name := strings.Fields(line + " x")[0]
		if c, ok := realCommands[name]; ok {
			fmt.Fprintf(&b, "  %-26s %s\n", strings.TrimSpace(name+" "+c.args), c.help)
			continue
		}
		b.WriteString(line)
	}
	b.WriteString("on real nodes also:\n")
	for _, n := range realOrder {
		c := realCommands[n]
		fmt.Fprintf(&b, "  %-26s %s\n", strings.TrimSpace(n+" "+c.args), c.help)
	}
	b.WriteString("nodes: " + strings.Join(realNodeNames(), ", ") + " (real), " + proxyNode + " (simulated: kube-proxy's, no pods)")
	return b.String()
}

// nodeNames are the demo's nodes in the view: the cluster's simulated ones, then the real ones.
func (d *demo) nodeNames() []string {
	var out []string
	for _, n := range d.c.Nodes {
		out = append(out, n.Name)
	}
	if d.real != nil {
		for _, n := range d.real.nodes {
			out = append(out, n.Name())
		}
	}
	return out
}

// kubeletState is "kubelet pid N, " or "kubelet stopped, " for a real node, "" otherwise.
func (d *demo) kubeletState(name string) string {
	if d.real == nil {
		return ""
	}
	n, err := d.real.node(name)
	if err != nil {
		return ""
	}
	if pid := n.KubeletPID(); pid != 0 {
		return fmt.Sprintf("kubelet pid %d, ", pid)
	}
	return "kubelet stopped, "
}
