// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// confineSocketLB makes the cgroup the socket load balancer attaches to: a cgroup2 mount of the
// hierarchy in this process's (private) mount namespace, a new sub-cgroup under its root, this
// test process moved into it when place.socketLB (the traffic client runs here; otherwise it
// stays empty), and a bind mount of the sub-cgroup as the agent's --cgroup-root. Cilium's
// socket programs then see only the sockets of this test binary's processes, never the
// machine's.
func (ca *ciliumAgent) confineSocketLB() error {
	root := filepath.Join(ca.dir, "cgroup2")
	if err := unix.Mount("none", root, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting cgroup2 at %s: %w", root, err)
	}
	ca.cgroupRoot = root
	sub, err := os.MkdirTemp(root, "swh-cilium-")
	if err != nil {
		return fmt.Errorf("creating a cgroup for cilium's socket load balancer: %w", err)
	}
	ca.cgroup = sub
	if ca.place.socketLB {
		if err := os.WriteFile(filepath.Join(sub, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			return fmt.Errorf("moving the test process into cgroup %s: %w", sub, err)
		}
	}
	mnt := filepath.Join(ca.dir, "cgroup")
	if err := unix.Mount(sub, mnt, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting cgroup %s on %s: %w", sub, mnt, err)
	}
	ca.cgroupMount = mnt
	return nil
}

// releaseCgroup moves every process of the sub-cgroup back to the root, removes it and
// unmounts what confineSocketLB mounted.
func (ca *ciliumAgent) releaseCgroup() error {
	var errs []error
	if ca.cgroupMount != "" {
		if err := unix.Unmount(ca.cgroupMount, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", ca.cgroupMount, err))
		}
		ca.cgroupMount = ""
	}
	if ca.cgroup != "" {
		procs, err := os.ReadFile(filepath.Join(ca.cgroup, "cgroup.procs"))
		if err != nil {
			errs = append(errs, fmt.Errorf("reading the processes of %s: %w", ca.cgroup, err))
		}
		for _, pid := range strings.Fields(string(procs)) {
			err := os.WriteFile(filepath.Join(ca.cgroupRoot, "cgroup.procs"), []byte(pid), 0o644)
			if err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("moving process %s out of %s: %w", pid, ca.cgroup, err))
			}
		}
		if err := removeCgroup(ca.cgroup); err != nil {
			errs = append(errs, err)
		} else {
			ca.cgroup = ""
		}
	}
	if ca.cgroupRoot != "" {
		if err := unix.Unmount(ca.cgroupRoot, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", ca.cgroupRoot, err))
		}
		ca.cgroupRoot = ""
	}
	return errors.Join(errs...)
}

// removeCgroup removes an empty cgroup; a process that is still exiting keeps it busy for a
// moment, so it retries for a few seconds.
func removeCgroup(path string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := unix.Rmdir(path)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("removing cgroup %s: %w", path, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
