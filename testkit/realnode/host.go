// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package realnode

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const cgroupFS = "/sys/fs/cgroup"

var (
	cgroupsOnce sync.Once
	cgroupsErr  error
)

// mountCgroups mounts the host's cgroup v1 hierarchies (and the v2 one beside them) under
// /sys/fs/cgroup when nothing is mounted there: an isolated test binary mounts a fresh sysfs,
// without the cgroup mounts, in its private mount namespace. The hierarchies are the host's
// (no cgroup namespace), so the kubelet and runc see the machine's real cgroups.
func mountCgroups() error {
	cgroupsOnce.Do(func() { cgroupsErr = doMountCgroups() })
	return cgroupsErr
}

func doMountCgroups() error {
	if _, err := os.Stat(filepath.Join(cgroupFS, "memory")); err == nil {
		return nil
	}
	if err := unix.Mount("tmpfs", cgroupFS, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=755"); err != nil {
		return fmt.Errorf("mounting a tmpfs on %s: %w", cgroupFS, err)
	}
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:path, e.g. "4:memory:/x", "9:name=systemd:/", "0::/".
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		dir, fstype, data := "unified", "cgroup2", ""
		if parts[1] != "" {
			dir, fstype, data = strings.TrimPrefix(parts[1], "name="), "cgroup", parts[1]
			if strings.HasPrefix(parts[1], "name=") {
				data = "none," + parts[1]
			}
		}
		target := filepath.Join(cgroupFS, dir)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		if err := unix.Mount("cgroup", target, fstype, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, data); err != nil {
			return fmt.Errorf("mounting cgroup %q on %s: %w", parts[1], target, err)
		}
	}
	return sc.Err()
}

// runDir is where containerd's shims put their sockets whatever the configuration says
// (/run/containerd/s) and ctr its FIFOs.
const runDir = "/run/containerd"

var runDirState struct {
	sync.Mutex
	users   int  // running nodes
	created bool // the folder did not exist before
}

// mountRunDir mounts a tmpfs on /run/containerd in the test binary's private mount namespace
// for the first node, so the shims' sockets stay there and vanish with it; unmountRunDir
// removes it (and the folder, when this process made it) after the last node.
func mountRunDir() error {
	runDirState.Lock()
	defer runDirState.Unlock()
	if runDirState.users > 0 {
		runDirState.users++
		return nil
	}
	if _, err := os.Stat(runDir); errors.Is(err, fs.ErrNotExist) {
		if err := os.Mkdir(runDir, 0o711); err != nil {
			return err
		}
		runDirState.created = true
	}
	if err := unix.Mount("tmpfs", runDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=711"); err != nil {
		return fmt.Errorf("mounting a tmpfs on %s: %w", runDir, err)
	}
	runDirState.users = 1
	return nil
}

func unmountRunDir() error {
	runDirState.Lock()
	defer runDirState.Unlock()
	if runDirState.users == 0 {
		return nil
	}
	runDirState.users--
	if runDirState.users > 0 {
		return nil
	}
	if err := unix.Unmount(runDir, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmounting %s: %w", runDir, err)
	}
	if runDirState.created {
		runDirState.created = false
		return os.Remove(runDir)
	}
	return nil
}

// hierarchies are the mounted cgroup v1 hierarchies' folders; with the v2 one too when all.
func hierarchies(all bool) []string {
	entries, err := os.ReadDir(cgroupFS)
	if err != nil {
		return nil
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() && (all || e.Name() != "unified") {
			dirs = append(dirs, filepath.Join(cgroupFS, e.Name()))
		}
	}
	return dirs
}

// makeCgroup creates the cgroup at path (e.g. "/swh123-node") in every v1 hierarchy: the
// kubelet wants its cgroup root to exist.
func makeCgroup(path string) error {
	for _, h := range hierarchies(false) {
		if err := os.MkdirAll(filepath.Join(h, path), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// killCgroup kills every process in the cgroup tree at path, in every hierarchy, and waits
// until the trees are empty.
func killCgroup(path string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids := cgroupPIDs(path)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v are still in cgroup %s", pids, path)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func cgroupPIDs(path string) []int {
	seen := map[int]bool{}
	for _, h := range hierarchies(true) {
		_ = filepath.WalkDir(filepath.Join(h, path), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	pids := make([]int, 0, len(seen))
	for pid := range seen {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	return pids
}

// removeCgroup removes the cgroup tree at path from every hierarchy (runc makes it in the v2 one
// as well), deepest first.
func removeCgroup(path string) error {
	var errs []error
	for _, h := range hierarchies(true) {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, path), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// killShims kills the containerd shims serving the containerd at socket (their command lines
// name its address) and waits until they are gone.
func killShims(socket string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids := shimPIDs(socket)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd shims %v are still running", pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func shimPIDs(socket string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if strings.HasSuffix(args[0], "containerd-shim-runc-v2") && strings.Contains(string(cmdline), socket) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// unmountUnder detaches every mount below dir, deepest first (the containers' root file
// systems, the pods' network namespaces and volumes).
func unmountUnder(dir string) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// removeLink deletes a network link (the node's CNI bridge) when it exists.
func removeLink(name string) error {
	if _, err := os.Stat(filepath.Join("/sys/class/net", name)); err != nil {
		return nil
	}
	if out, err := exec.Command("ip", "link", "del", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip link del %s: %w: %s", name, err, out)
	}
	return nil
}
