// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package capacity

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// BenchmarkFloorCapacity is the physical floor of a probe on this machine: the same n targets
// with a 1 s period against the same server as BenchmarkCapacity and BenchmarkKubeletCapacity,
// probed by one OS thread that makes only the system calls a probe cannot do without, with no
// scheduler, no contexts, no allocation per probe. The report divides the others' CPU per probe
// by this one's.
//
//   - tcp: socket (non-blocking), SO_LINGER 0, connect, one readiness check (ppoll with a zero
//     timeout; epoll when the handshake is not done when connect returns), close: a reset.
//   - http: the same connect, then one fixed HTTP/1.1 GET /healthz with "Connection: close",
//     the response read into a fixed buffer until its headers and Content-Length body are in
//     (epoll for the wait), the status line checked for 200, close: a reset.
//
// Each target keeps a fixed offset within the period (random, like the kubelet's first sleep);
// lag is how late a probe started against its plan (the thread wakes with epoll_wait's
// millisecond timeout, so up to about 1 ms is the floor's own granularity). A probe not done
// within 1 s is a failure.
//
//	cd bench/capacity && GOWORK=off go test -run '^$' -bench 'FloorCapacity/tcp/10000$' -benchtime 1x
//
// Environment as for BenchmarkKubeletCapacity.
func BenchmarkFloorCapacity(b *testing.B) {
	addrs := startServer(b)
	for _, mode := range []string{"tcp", "http"} {
		for _, n := range []int{1000, 5000, 10000} {
			b.Run(fmt.Sprintf("%s/%d", mode, n), func(b *testing.B) {
				runFloor(b, mode, n, addrs[mode])
			})
		}
	}
}

func runFloor(b *testing.B, mode string, n int, addrs []string) {
	warmup := envDuration(b, "SWH_CAPACITY_WARMUP", 5*time.Second)
	measure := envDuration(b, "SWH_CAPACITY_DURATION", 20*time.Second)

	l, err := newFloorLoop(mode, n, addrs, time.Second, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.run() }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		l.stop.Store(true)
		return <-done
	}
	defer func() { _ = stop() }()

	time.Sleep(warmup) // a benchmark, not a test: the load runs for a fixed time
	b.ResetTimer()
	l.runs.Store(0)
	l.failures.Store(0)
	l.recording.Store(true)
	user0, sys0 := cpuTime(b)
	wall0 := time.Now()
	time.Sleep(measure)
	user1, sys1 := cpuTime(b)
	wall1 := time.Now()
	l.recording.Store(false)
	r, f := l.runs.Load(), l.failures.Load()
	b.StopTimer()
	if err := stop(); err != nil {
		b.Fatal(err)
	}
	for reason, count := range l.reasons {
		b.Logf("%d failures: %s", count, reason)
	}
	report(b, reportInput{
		wall: wall1.Sub(wall0), user: user1 - user0, sys: sys1 - sys0,
		runs: r, failures: f, lags: l.lags,
	})
}

// Phases of a floor probe.
const (
	phaseIdle       = iota // the slot holds no probe
	phaseConnecting        // connect returned EINPROGRESS and the handshake is not done
	phaseReading           // http: the request is sent, the response is being read
)

// floorConn is the state of one probe in flight, by file descriptor.
type floorConn struct {
	gen    uint32 // bumped per probe, so a stale timeout entry is recognised
	phase  uint8
	polled bool // in the epoll set (for reads and writes, edge-triggered)
	target int32
	n      int // bytes of the response read so far
	buf    []byte
}

type floorTimeout struct {
	fd       int32
	gen      uint32
	deadline int64
}

type floorTarget struct {
	sa  *syscall.SockaddrInet4
	req []byte // http only
}

// floorLoop probes n targets from one OS thread with raw system calls.
type floorLoop struct {
	http    bool
	period  int64 // ns
	timeout int64 // ns
	targets []floorTarget
	// offsets are the targets' starts within the period, sorted, with their target index.
	offsets []floorOffset

	epfd     int
	conns    []floorConn
	timeouts []floorTimeout // from head on, in deadline order: every probe has the same timeout
	head     int
	events   []syscall.EpollEvent

	stop      atomic.Bool
	recording atomic.Bool
	runs      atomic.Int64
	failures  atomic.Int64
	lags      []float64      // seconds, while recording; read after run returns
	reasons   map[string]int // failure reasons, read after run returns
}

type floorOffset struct {
	at     int64
	target int32
}

func newFloorLoop(mode string, n int, addrs []string, period, timeout time.Duration) (*floorLoop, error) {
	l := &floorLoop{
		http: mode == "http", period: int64(period), timeout: int64(timeout),
		events: make([]syscall.EpollEvent, 256), reasons: map[string]int{},
		lags: make([]float64, 0, 1<<18),
	}
	byAddr := map[string]floorTarget{}
	for _, a := range addrs {
		ap, err := netip.ParseAddrPort(a)
		if err != nil || !ap.Addr().Is4() {
			return nil, fmt.Errorf("server address %q: want IPv4 host:port", a)
		}
		t := floorTarget{sa: &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}}
		if l.http {
			t.req = fmt.Appendf(nil, "GET /healthz HTTP/1.1\r\nHost: %s\r\nUser-Agent: floor\r\nAccept: */*\r\nConnection: close\r\n\r\n", a)
		}
		byAddr[a] = t
	}
	for i := range n {
		l.targets = append(l.targets, byAddr[addrs[i%len(addrs)]])
		l.offsets = append(l.offsets, floorOffset{at: rand.Int64N(l.period), target: int32(i)})
	}
	slices.SortFunc(l.offsets, func(a, b floorOffset) int { return int(a.at - b.at) })
	return l, nil
}

// run probes until stop is set. It owns its OS thread, so the loop is one thread's work.
func (l *floorLoop) run() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("epoll_create1: %w", err)
	}
	l.epfd = epfd
	defer func() {
		for fd := range l.conns {
			if l.conns[fd].phase != phaseIdle {
				_ = syscall.Close(fd)
			}
		}
		_ = syscall.Close(epfd)
	}()

	base := time.Now()
	now := func() int64 { return int64(time.Since(base)) }
	var cycle int64 // start of the current period
	next := 0       // index in offsets of the next probe to start
	for !l.stop.Load() {
		t := now()
		// Start every probe that is due.
		for {
			due := cycle + l.offsets[next].at
			if due > t {
				break
			}
			if l.recording.Load() {
				l.lags = append(l.lags, float64(t-due)/1e9)
			}
			l.start(l.offsets[next].target, t)
			if next++; next == len(l.offsets) {
				next, cycle = 0, cycle+l.period
			}
			t = now()
		}
		// Time out what is overdue.
		for l.head < len(l.timeouts) && l.timeouts[l.head].deadline <= t {
			to := l.timeouts[l.head]
			l.head++
			if c := &l.conns[to.fd]; c.gen == to.gen && c.phase != phaseIdle {
				l.finish(int(to.fd), "timeout")
			}
		}
		// Wait for sockets or the next due probe, whichever is first (at most 10 ms, to see stop).
		wait := min(cycle+l.offsets[next].at-t, int64(10*time.Millisecond))
		if l.head < len(l.timeouts) {
			wait = min(wait, l.timeouts[l.head].deadline-t)
		}
		msec := int((max(wait, 0) + int64(time.Millisecond) - 1) / int64(time.Millisecond))
		ready, err := syscall.EpollWait(l.epfd, l.events, msec)
		if err != nil && err != syscall.EINTR {
			return fmt.Errorf("epoll_wait: %w", err)
		}
		for _, ev := range l.events[:max(ready, 0)] {
			l.ready(int(ev.Fd), ev.Events)
		}
	}
	return nil
}

// start begins one probe: the connect, and, where the handshake is already done (on loopback and
// a local veth it is), the rest of it.
func (l *floorLoop) start(target int32, t int64) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		l.fail("socket: " + err.Error())
		return
	}
	if err := syscall.SetsockoptLinger(fd, syscall.SOL_SOCKET, syscall.SO_LINGER, &syscall.Linger{Onoff: 1}); err != nil {
		_ = syscall.Close(fd)
		l.fail("SO_LINGER: " + err.Error())
		return
	}
	for fd >= len(l.conns) {
		l.conns = append(l.conns, floorConn{})
	}
	c := &l.conns[fd]
	c.gen++
	c.target, c.n, c.polled = target, 0, false
	if err := syscall.Connect(fd, l.targets[target].sa); err != syscall.EINPROGRESS {
		if err == nil {
			err = syscall.EISCONN // a TCP connect that does not block is not expected
		}
		_ = syscall.Close(fd)
		l.fail("connect: " + err.Error())
		return
	}
	c.phase = phaseConnecting
	if l.head > 4096 && l.head > len(l.timeouts)/2 {
		// Reuse the front of the queue, which holds only entries already handled.
		l.timeouts = l.timeouts[:copy(l.timeouts, l.timeouts[l.head:])]
		l.head = 0
	}
	l.timeouts = append(l.timeouts, floorTimeout{fd: int32(fd), gen: c.gen, deadline: t + l.timeout})
	switch rev := ppoll0(fd); {
	case rev&(pollErr|pollHup) != 0:
		l.finish(fd, connectError(fd))
	case rev&pollOut != 0:
		l.connected(fd)
	default:
		// Not connected yet: wait for it (and, for http, for the response) with epoll.
		ev := syscall.EpollEvent{Events: syscall.EPOLLOUT | syscall.EPOLLIN | syscall.EPOLLRDHUP | -syscall.EPOLLET, Fd: int32(fd)}
		if err := syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
			l.finish(fd, "epoll_ctl: "+err.Error())
			return
		}
		c.polled = true
	}
}

// connected goes on once the handshake is done: tcp is finished, http sends its request.
func (l *floorLoop) connected(fd int) {
	c := &l.conns[fd]
	if !l.http {
		l.finish(fd, "")
		return
	}
	req := l.targets[c.target].req
	if n, err := syscall.Write(fd, req); err != nil || n != len(req) {
		l.finish(fd, fmt.Sprintf("write: %d bytes, %v", n, err))
		return
	}
	if c.buf == nil {
		c.buf = make([]byte, 4<<10) // once per descriptor number, reused by later probes
	}
	c.phase = phaseReading
	if !c.polled {
		// The response takes the server's turn: wait for it with epoll.
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | -syscall.EPOLLET, Fd: int32(fd)}
		if err := syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
			l.finish(fd, "epoll_ctl: "+err.Error())
			return
		}
		c.polled = true
	}
	l.read(fd)
}

// ready handles an epoll event of fd.
func (l *floorLoop) ready(fd int, events uint32) {
	if fd >= len(l.conns) {
		return
	}
	switch l.conns[fd].phase {
	case phaseConnecting:
		if events&(syscall.EPOLLERR|syscall.EPOLLHUP) != 0 {
			l.finish(fd, connectError(fd))
			return
		}
		if events&syscall.EPOLLOUT != 0 {
			l.connected(fd)
		}
	case phaseReading:
		l.read(fd)
	}
}

// read reads what the response has so far and finishes the probe once it is complete.
func (l *floorLoop) read(fd int) {
	c := &l.conns[fd]
	for {
		if c.n == len(c.buf) {
			l.finish(fd, "response larger than the buffer")
			return
		}
		n, err := syscall.Read(fd, c.buf[c.n:])
		if err == syscall.EAGAIN {
			return
		}
		if err != nil {
			l.finish(fd, "read: "+err.Error())
			return
		}
		if n == 0 {
			l.finish(fd, responseVerdict(c.buf[:c.n], true))
			return
		}
		c.n += n
		if verdict := responseVerdict(c.buf[:c.n], false); verdict != "incomplete" {
			l.finish(fd, verdict)
			return
		}
	}
}

// responseVerdict judges a response read so far: "" when it is a complete 200, "incomplete" when
// more is to come, else the reason it fails. eof says the server closed.
func responseVerdict(resp []byte, eof bool) string {
	end := bytes.Index(resp, []byte("\r\n\r\n"))
	if end < 0 {
		if eof {
			return "connection closed before the headers ended"
		}
		return "incomplete"
	}
	if !bytes.HasPrefix(resp, []byte("HTTP/1.1 200 ")) {
		line, _, _ := bytes.Cut(resp, []byte("\r\n"))
		return "status " + string(line)
	}
	body := 0
	// net/http writes the header in its canonical case; the floor parses no more than it needs.
	if i := bytes.Index(resp[:end], []byte("\r\nContent-Length: ")); i >= 0 {
		for _, ch := range resp[i+len("\r\nContent-Length: ") : end] {
			if ch < '0' || ch > '9' {
				break
			}
			body = body*10 + int(ch-'0')
		}
	}
	if len(resp) < end+4+body && !eof {
		return "incomplete"
	}
	return ""
}

// finish ends the probe on fd: close (a reset: SO_LINGER 0), counted as a success when reason is
// empty.
func (l *floorLoop) finish(fd int, reason string) {
	l.conns[fd].phase = phaseIdle
	_ = syscall.Close(fd) // also removes it from the epoll set
	if reason != "" {
		l.fail(reason)
		return
	}
	l.runs.Add(1)
}

func (l *floorLoop) fail(reason string) {
	l.runs.Add(1)
	l.failures.Add(1)
	l.reasons[reason]++
}

// connectError is the error of a failed non-blocking connect.
func connectError(fd int) string {
	v, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ERROR)
	if err != nil {
		return "getsockopt SO_ERROR: " + err.Error()
	}
	return "connect: " + syscall.Errno(v).Error()
}

// The poll(2) event bits.
const (
	pollOut = 0x4
	pollErr = 0x8
	pollHup = 0x10
)

// ppoll0 is ppoll(2) of one descriptor for writability with a zero timeout: its revents.
func ppoll0(fd int) int16 {
	pfd := struct {
		fd      int32
		events  int16
		revents int16
	}{fd: int32(fd), events: pollOut}
	var ts syscall.Timespec
	_, _, errno := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	if errno != 0 {
		return pollErr
	}
	return pfd.revents
}
