// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package realnode

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// PodPIDs are the processes of the pod's containers (its sandbox's pause process among them),
// found in the pod's cgroup below the node's cgroup root (the kubelet's cgroupfs layout:
// <root>/kubepods[/<qos>]/pod<uid>/<container>), as this process's PID namespace numbers them.
func (n *Node) PodPIDs(uid string) ([]int, error) {
	dirs := podCgroupDirs(n.cgroupRoot(), uid)
	if len(dirs) == 0 {
		return nil, fmt.Errorf("no cgroup of pod %s below %s", uid, n.cgroupRoot())
	}
	seen := map[int]bool{}
	var pids []int
	for _, dir := range dirs {
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	if len(pids) == 0 {
		return nil, fmt.Errorf("pod %s has no process", uid)
	}
	return pids, nil
}

// PodNetns is a path of the pod's network namespace (/proc/<pid>/ns/net of one of its
// processes) for nsenter --net: a host program started there (PostgreSQL in `make run
// NODES=real`) listens on the pod's IP. It stays valid while that process lives.
func (n *Node) PodNetns(uid string) (string, error) {
	pids, err := n.PodPIDs(uid)
	if err != nil {
		return "", err
	}
	return filepath.Join("/proc", strconv.Itoa(pids[0]), "ns", "net"), nil
}

// podCgroupDirs are the pod's cgroup folders in every mounted hierarchy (the cgroupfs driver
// names them pod<uid>).
func podCgroupDirs(root, uid string) []string {
	var out []string
	for _, h := range hierarchies(false) {
		_ = filepath.WalkDir(filepath.Join(h, root), func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if d.Name() == "pod"+uid {
				out = append(out, p)
				return fs.SkipDir
			}
			return nil
		})
	}
	return out
}
