// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package loopback hands out free TCP addresses on 127.0.0.1 for the programs and servers a
// test starts (their metrics, health and probe ports): a port the kernel picks, never the same
// one twice in this process, so two programs started one after the other cannot be handed the
// port the first has not bound yet.
package loopback

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
)

// used holds every port handed out in this process.
var used = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago and was not handed out
// before in this process.
func FreePort() (int, error) {
	used.Lock()
	defer used.Unlock()
	for range 100 {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("finding a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if !used.ports[port] {
			used.ports[port] = true
			return port, nil
		}
	}
	return 0, errors.New("finding a free port: every port the kernel offered was handed out before")
}

// FreeAddr is FreePort as "127.0.0.1:<port>".
func FreeAddr() (string, error) {
	port, err := FreePort()
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(port), nil
}

// FreeAddrs is n FreeAddrs, for a program's several ports (metrics, health probes).
func FreeAddrs(n int) ([]string, error) {
	out := make([]string, n)
	for i := range out {
		var err error
		if out[i], err = FreeAddr(); err != nil {
			return nil, err
		}
	}
	return out, nil
}
