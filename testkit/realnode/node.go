// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package realnode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

// Options describe one real node.
type Options struct {
	// Name is the Node's name (the kubelet's --hostname-override).
	Name string
	// NodeIP is the node's InternalIP (the kubelet's --node-ip and its server's address).
	NodeIP string
	// PodCIDR is the node's pod range (the kubelet's podCIDR, the CNI plugin's host-local range).
	PodCIDR string
	// Bridge is the name of the node's CNI bridge.
	Bridge string
	// Dir is the node's state folder: containerd's root, state and socket, the kubelet's root,
	// CNI configuration and address leases, logs. It must exist.
	Dir string
	// ToolsDir holds containerd, ctr, containerd-shim-runc-v2 and the CNI plugins (tools/build.sh
	// --dir containerd).
	ToolsDir string
	// Kubelet is the kubelet binary (tools/build.sh --dir node).
	Kubelet string
	// Runc is the OCI runtime binary; default /usr/sbin/runc (Debian's runc).
	Runc string
	// PauseImage is the sandbox image's reference; it must be among Images.
	PauseImage string
	// Images are OCI archives imported into containerd's k8s.io namespace before the kubelet
	// starts.
	Images []string
	// KubeConfig is the kubelet's credential: a client certificate for system:node:<Name> in
	// system:nodes.
	KubeConfig []byte
}

// Node is a running real node: a containerd and a kubelet.
type Node struct {
	opts        Options
	runDir      bool // mountRunDir succeeded
	snapshotter string
	containerd  *process.Process
	kubelet     *process.Process
}

// Start starts the node's containerd, imports the images and starts its kubelet. The kubelet
// registers the Node itself; wait for its Ready condition through the API. Stop removes
// everything Start made, also after a failed Start.
func Start(ctx context.Context, opts Options) (*Node, error) {
	if opts.Runc == "" {
		opts.Runc = "/usr/sbin/runc"
	}
	n := &Node{opts: opts, snapshotter: "overlayfs"}
	if err := n.prepare(); err != nil {
		return n, err
	}
	if err := n.startContainerd(ctx); err != nil {
		return n, err
	}
	for _, archive := range opts.Images {
		if out, err := n.ctr(ctx, "images", "import", "--snapshotter", n.snapshotter, archive); err != nil {
			return n, fmt.Errorf("importing %s: %w: %s", archive, err, out)
		}
	}
	return n, n.startKubelet()
}

// ContainerdSocket is the path of the node's containerd socket (ctr -a, crictl).
func (n *Node) ContainerdSocket() string { return n.path("containerd.sock") }

// Name is the node's name.
func (n *Node) Name() string { return n.opts.Name }

// KubeletPID is the kubelet's process id (0 when it is not running).
func (n *Node) KubeletPID() int {
	if n.kubelet == nil || n.kubelet.Exited() {
		return 0
	}
	return n.kubelet.PID()
}

// Logs returns the last bytes of the kubelet's and containerd's logs, for a failure message.
func (n *Node) Logs(limit int64) string {
	var b strings.Builder
	for _, name := range []string{"containerd.log", "kubelet.log"} {
		data, err := os.ReadFile(n.path(name))
		if err != nil {
			continue
		}
		if int64(len(data)) > limit {
			data = data[int64(len(data))-limit:]
		}
		fmt.Fprintf(&b, "--- %s (last %d bytes)\n%s\n", name, limit, data)
	}
	return b.String()
}

func (n *Node) path(elem ...string) string {
	return filepath.Join(append([]string{n.opts.Dir}, elem...)...)
}

func (n *Node) prepare() error {
	if err := mountCgroups(); err != nil {
		return err
	}
	if err := mountRunDir(); err != nil {
		return err
	}
	n.runDir = true
	if err := makeCgroup(n.cgroupRoot()); err != nil {
		return err
	}
	for _, d := range [][]string{{"containerd", "root"}, {"containerd", "state"}, {"kubelet"},
		{"cni", "net.d"}, {"cni", "ipam"}, {"pod-logs"}} {
		if err := os.MkdirAll(n.path(d...), 0o750); err != nil {
			return err
		}
	}
	files := map[string]string{
		n.path("containerd.toml"):                 containerdConfig(n),
		n.path("cni", "net.d", "10-swh.conflist"): cniConfig(n),
		n.path("kubelet.yaml"):                    kubeletConfig(n),
		n.path("kubelet.kubeconfig"):              string(n.opts.KubeConfig),
	}
	for p, data := range files {
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			return err
		}
	}
	return nil
}

func (n *Node) startContainerd(ctx context.Context) error {
	cmd := exec.Command(filepath.Join(n.opts.ToolsDir, "containerd"), "--config", n.path("containerd.toml"))
	// The shim is found on PATH; runc by the configuration.
	cmd.Env = append(os.Environ(), "PATH="+n.opts.ToolsDir+":"+os.Getenv("PATH"))
	p, err := process.Start("containerd", cmd, process.Options{LogFile: n.path("containerd.log"), Grace: 10 * time.Second})
	if err != nil {
		return err
	}
	n.containerd = p
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := n.ctr(ctx, "version")
		if err == nil {
			return nil
		}
		if p.Exited() || time.Now().After(deadline) {
			return fmt.Errorf("containerd did not answer: %w: %s\n%s", err, out, n.Logs(4000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (n *Node) startKubelet() error {
	cmd := exec.Command(n.opts.Kubelet,
		"--config", n.path("kubelet.yaml"),
		"--kubeconfig", n.path("kubelet.kubeconfig"),
		"--root-dir", n.path("kubelet"),
		"--cert-dir", n.path("kubelet", "pki"),
		"--hostname-override", n.opts.Name,
		"--node-ip", n.opts.NodeIP,
		"--v", "2",
	)
	p, err := process.Start("kubelet", cmd, process.Options{LogFile: n.path("kubelet.log"), Grace: 10 * time.Second})
	if err != nil {
		return err
	}
	n.kubelet = p
	return nil
}

// StopKubelet stops only the kubelet (SIGTERM): its pods keep running in containerd, as on a
// node whose kubelet died.
func (n *Node) StopKubelet() error {
	if n.kubelet == nil {
		return nil
	}
	return n.kubelet.Stop()
}

// StartKubelet starts the kubelet again after StopKubelet.
func (n *Node) StartKubelet() error { return n.startKubelet() }

func (n *Node) ctr(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	all := append([]string{"--address", n.ContainerdSocket(), "--namespace", "k8s.io"}, args...)
	out, err := exec.CommandContext(ctx, filepath.Join(n.opts.ToolsDir, "ctr"), all...).CombinedOutput()
	return string(out), err
}

// Stop stops the kubelet and containerd, kills what is left of the node's containers and
// shims, and removes the node's mounts and cgroups. Its folder stays (the caller's).
func (n *Node) Stop() error {
	var errs []error
	if n.kubelet != nil {
		errs = append(errs, n.kubelet.Stop())
	}
	errs = append(errs, n.killContainers())
	if n.containerd != nil {
		errs = append(errs, n.containerd.Stop())
	}
	errs = append(errs, killShims(n.ContainerdSocket()), unmountUnder(n.opts.Dir),
		removeCgroup(n.cgroupRoot()), removeLink(n.opts.Bridge))
	if n.runDir {
		n.runDir = false
		errs = append(errs, unmountRunDir())
	}
	return errors.Join(errs...)
}

// killContainers kills every process of the node's cgroup tree (the pods' containers).
func (n *Node) killContainers() error {
	return killCgroup(n.cgroupRoot())
}

func (n *Node) cgroupRoot() string {
	return fmt.Sprintf("/swh%d-%s", os.Getpid(), n.opts.Name)
}
