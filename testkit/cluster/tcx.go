// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"fmt"
	"net"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The bpf(2) command and attach types waitTCXAttached needs (include/uapi/linux/bpf.h).
const (
	bpfProgQuery  = 16 // BPF_PROG_QUERY
	bpfTCXIngress = 46 // BPF_TCX_INGRESS
	bpfTCXEgress  = 47 // BPF_TCX_EGRESS
)

// bpfQueryAttr is the query member of union bpf_attr for BPF_PROG_QUERY.
type bpfQueryAttr struct {
	targetIfindex   uint32
	attachType      uint32
	queryFlags      uint32
	attachFlags     uint32
	progIDs         uint64
	progCount       uint32
	_               uint32
	progAttachFlags uint64
	linkIDs         uint64
	linkAttachFlags uint64
	revision        uint64
}

// tcxPrograms is the number of BPF programs attached with tcx to the link's ingress and egress.
func tcxPrograms(link string) (ingress, egress int, err error) {
	ifc, err := net.InterfaceByName(link)
	if err != nil {
		return 0, 0, err
	}
	count := func(attachType uint32) (int, error) {
		attr := bpfQueryAttr{targetIfindex: uint32(ifc.Index), attachType: attachType}
		_, _, errno := unix.Syscall(unix.SYS_BPF, bpfProgQuery, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
		if errno != 0 {
			return 0, fmt.Errorf("bpf(BPF_PROG_QUERY) on %s: %w", link, errno)
		}
		return int(attr.progCount), nil
	}
	if ingress, err = count(bpfTCXIngress); err != nil {
		return 0, 0, err
	}
	egress, err = count(bpfTCXEgress)
	return ingress, egress, err
}

// waitTCXAttached waits until the link in the network namespace at netnsPath has a tcx program
// on its ingress and on its egress (cilium-agent's cil_from_netdev, cil_to_netdev).
func waitTCXAttached(netnsPath, link string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var in, out int
		err := inNetns(netnsPath, func() error {
			var err error
			in, out, err = tcxPrograms(link)
			return err
		})
		if err == nil && in > 0 && out > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("cilium-agent did not attach its programs to %s within %s: %w", link, timeout, err)
			}
			return fmt.Errorf("cilium-agent did not attach its programs to %s within %s (tcx programs: ingress %d, egress %d)", link, timeout, in, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
