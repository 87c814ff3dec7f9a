// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package realnode

import (
	"fmt"
	"strings"
)

// containerdConfig is containerd 2.x's configuration (version 3) for one node: its own root,
// state and sockets, runc from the host, the CRI plugin with the local sandbox image and CNI
// from the node's folders.
func containerdConfig(n *Node) string {
	r := strings.NewReplacer(
		"@ROOT@", n.path("containerd", "root"),
		"@STATE@", n.path("containerd", "state"),
		"@SOCK@", n.ContainerdSocket(),
		"@SNAPSHOTTER@", n.snapshotter,
		"@PAUSE@", n.opts.PauseImage,
		"@RUNC@", n.opts.Runc,
		"@CNIBIN@", n.opts.ToolsDir,
		"@CNICONF@", n.path("cni", "net.d"),
	)
	return r.Replace(`version = 3
root = "@ROOT@"
state = "@STATE@"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "@SOCK@"

[ttrpc]
  address = "@SOCK@.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "@SNAPSHOTTER@"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "@PAUSE@"

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  netns_mounts_under_state_dir = true
  # This machine's root has no CAP_SYS_RESOURCE (it is not in the bounding set), so nobody may
  # lower an oom_score_adj below 0: without this, runc refuses the sandbox's -998 ("nsexec:
  # failed to update /proc/self/oom_score_adj: Permission denied"). With it, containerd raises
  # every container's value to its own (0).
  restrict_oom_score_adj = true

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = "@RUNC@"
  Root = "@STATE@/runc"
  SystemdCgroup = false

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["@CNIBIN@"]
  conf_dir = "@CNICONF@"
  max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`)
}

// cniConfig is the node's pod network: the bridge plugin with host-local addresses from the
// node's pod range, the node's address on the bridge as every pod's gateway.
func cniConfig(n *Node) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "swh-%[1]s",
  "plugins": [{
    "type": "bridge",
    "bridge": "%[2]s",
    "isGateway": true,
    "ipMasq": false,
    "hairpinMode": true,
    "ipam": {
      "type": "host-local",
      "dataDir": "%[3]s",
      "ranges": [[{"subnet": "%[4]s"}]],
      "routes": [{"dst": "0.0.0.0/0"}]
    }
  }]
}
`, n.opts.Name, n.opts.Bridge, n.path("cni", "ipam"), n.opts.PodCIDR)
}

// kubeletConfig is the kubelet's KubeletConfiguration: cgroup v1 allowed (failCgroupV1: false),
// cgroupfs under the node's own cgroup root, swap tolerated, the node's own folders and the
// node's containerd; no anonymous access, no read-only port, no eviction by this shared
// machine's disk or memory.
func kubeletConfig(n *Node) string {
	r := strings.NewReplacer(
		"@SOCK@", n.ContainerdSocket(),
		"@CGROOT@", n.cgroupRoot(),
		"@PODCIDR@", n.opts.PodCIDR,
		"@ADDR@", n.opts.NodeIP,
		"@LOGS@", n.path("pod-logs"),
	)
	return r.Replace(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
cgroupDriver: cgroupfs
cgroupRoot: "@CGROOT@"
cgroupsPerQOS: true
enforceNodeAllocatable: ["pods"]
containerRuntimeEndpoint: "unix://@SOCK@"
podCIDR: "@PODCIDR@"
address: "@ADDR@"
port: 10250
readOnlyPort: 0
healthzPort: 0
podLogsDir: "@LOGS@"
resolvConf: ""
staticPodPath: ""
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509: {}
authorization:
  mode: AlwaysAllow
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
protectKernelDefaults: false
registerNode: true
nodeStatusUpdateFrequency: 1s
nodeStatusReportFrequency: 10s
syncFrequency: 5s
fileCheckFrequency: 5s
shutdownGracePeriod: 0s
serializeImagePulls: false
`)
}
