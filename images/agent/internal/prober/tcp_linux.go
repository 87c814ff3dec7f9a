// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"context"
	"net/netip"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// connectAndReset is the TCP probe in bare system calls: socket (non-blocking), SO_LINGER 0,
// connect, one ppoll with a zero timeout, close. net.Dialer does about twice as many for the
// same (the address lookup, getsockname, getpeername, TCP_NODELAY, epoll registration and
// removal, a context and a goroutine hand-over), which was a third of a TCP probe's user-space
// CPU (development/BENCHMARKS-HISTORY.md, "Probe capacity"). On loopback and on a local pod's veth the
// handshake is done when connect returns, and the probe ends there. Otherwise (a remote address,
// a busy kernel, a port that drops SYNs) it waits in Go's poller like net.Dialer does, cut at
// deadline or when ctx ends (waitConnect).
func connectAndReset(ctx context.Context, addr netip.AddrPort, deadline time.Time, timeout time.Duration) Result {
	if addr.Addr().Zone() != "" {
		// A scoped address needs the interface lookup the net package does. Pod IPs have none.
		return dialAndReset(ctx, addr, deadline, timeout)
	}
	if err := ctx.Err(); err != nil {
		return failure(netReason(ctx, err, timeout))
	}
	family := syscall.AF_INET
	if addr.Addr().Is6() {
		family = syscall.AF_INET6
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return failure(netReason(ctx, err, timeout))
	}
	if err := syscall.SetsockoptLinger(fd, syscall.SOL_SOCKET, syscall.SO_LINGER, &resetOnClose); err != nil {
		_ = syscall.Close(fd)
		return failure(netReason(ctx, err, timeout))
	}
	// connect returns the bare errno (0: connected), so a switch on its value is exact.
	switch errno := connect(fd, addr); errno {
	case 0, syscall.EISCONN:
		_ = syscall.Close(fd)
		return success("connected")
	case syscall.EINPROGRESS, syscall.EALREADY, syscall.EINTR:
	default:
		_ = syscall.Close(fd)
		return failure(netReason(ctx, errno, timeout))
	}
	if done, err := connectDone(fd); done {
		_ = syscall.Close(fd)
		if err != nil {
			return failure(netReason(ctx, err, timeout))
		}
		return success("connected")
	}
	return waitConnect(ctx, fd, deadline, timeout)
}

// waitConnect waits for a connect in progress on fd in Go's poller until deadline or ctx's
// end, then closes fd (a reset).
func waitConnect(ctx context.Context, fd int, deadline time.Time, timeout time.Duration) Result {
	// os.NewFile puts the non-blocking descriptor into the poller; Close takes it out.
	f := os.NewFile(uintptr(fd), "probe")
	defer func() { _ = f.Close() }()
	if err := f.SetWriteDeadline(deadline); err != nil {
		return failure(netReason(ctx, err, timeout))
	}
	// ctx's end (a removed target, the agent stopping) interrupts the wait, as in net.Dialer.
	stop := context.AfterFunc(ctx, func() { _ = f.SetWriteDeadline(time.Unix(1, 0)) })
	rc, err := f.SyscallConn()
	if err != nil {
		stop()
		return failure(netReason(ctx, err, timeout))
	}
	var connErr error
	werr := rc.Write(func(fd uintptr) bool {
		// The poller may wake spuriously: ask the socket itself.
		done, err := connectDone(int(fd))
		connErr = err
		return done
	})
	if !stop() {
		// ctx ended; its deadline may have been poisoned after a connect that succeeded.
		return failure(netReason(ctx, ctx.Err(), timeout))
	}
	if werr != nil {
		return failure(netReason(ctx, werr, timeout))
	}
	if connErr != nil {
		return failure(netReason(ctx, connErr, timeout))
	}
	return success("connected")
}

// The poll(2) event bits.
const (
	pollOut = 0x4
	pollErr = 0x8
	pollHup = 0x10
)

// connectDone tells whether the connect in progress on fd has ended and, if so, its error
// (nil: connected). A socket that still sends its SYN is not writable; one that connected is;
// a refused or reset one reports POLLERR, and SO_ERROR says why.
func connectDone(fd int) (bool, error) {
	pfd := struct {
		fd      int32
		events  int16
		revents int16
	}{fd: int32(fd), events: pollOut}
	var zero syscall.Timespec
	// A zero timeout: ppoll does not block, so the raw form (no hand-over of the P) is right.
	_, _, errno := syscall.RawSyscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, uintptr(unsafe.Pointer(&zero)), 0, 0, 0)
	switch {
	case errno != 0:
		return true, errno
	case pfd.revents&(pollErr|pollHup) != 0:
		v, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ERROR)
		if err != nil {
			return true, err
		}
		if v == 0 {
			// Hung up without an error: the connection went as soon as it came.
			return true, syscall.ECONNRESET
		}
		return true, syscall.Errno(v)
	case pfd.revents&pollOut != 0:
		return true, nil
	}
	return false, nil
}

// connect starts a connect of fd to addr with a socket address on the stack (syscall.Connect
// takes an interface, which puts it on the heap) and returns the system call's errno.
func connect(fd int, addr netip.AddrPort) syscall.Errno {
	var errno syscall.Errno
	port := [2]byte{byte(addr.Port() >> 8), byte(addr.Port())} // network byte order
	if addr.Addr().Is4() {
		sa := syscall.RawSockaddrInet4{Family: syscall.AF_INET, Port: *(*uint16)(unsafe.Pointer(&port)), Addr: addr.Addr().As4()}
		_, _, errno = syscall.Syscall(syscall.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa)), unsafe.Sizeof(sa))
	} else {
		sa := syscall.RawSockaddrInet6{Family: syscall.AF_INET6, Port: *(*uint16)(unsafe.Pointer(&port)), Addr: addr.Addr().As16()}
		_, _, errno = syscall.Syscall(syscall.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa)), unsafe.Sizeof(sa))
	}
	return errno
}
