// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The test binary runs in three stages, told apart by stageEnv:
//
//   - outer (unset): the process `go test` started. It re-executes itself as "init" in new
//     network, mount and PID namespaces, forwards signals to it and exits with its status.
//   - init: PID 1 of the new PID namespace. It makes its mounts private, mounts a fresh /proc,
//     /sys and an empty /run/netns, builds the cluster namespace's network (lo, the gateway veth
//     pair, the default route), starts the "test" stage and reaps every orphan. When it exits,
//     the kernel kills whatever is left in the PID namespace, and the network namespaces die with
//     their last process and mount.
//   - test: the process that runs the tests, inside the cluster network namespace.
const (
	stageEnv    = "SWH_CLUSTER_STAGE"
	outerPIDEnv = "SWH_CLUSTER_OUTER_PID"
	tmpDirEnv   = "SWH_CLUSTER_TMPDIR"
	stageInit   = "init"
	stageTest   = "test"
)

// notIsolatedReason is set when Isolate ran but could not isolate (not root).
var notIsolatedReason string

// Isolated reports whether this process runs in the isolated cluster namespaces (Isolate or
// RunIsolated was called in TestMain and the process is root).
func Isolated() bool {
	return os.Getenv(stageEnv) == stageTest
}

// RunIsolated is a whole TestMain: it isolates the test binary (see Isolate), runs the tests,
// runs the after steps (stopping what the package's tests shared: Main, stack.Main), then fails
// the package if a step failed or if any network namespace, link, process, nftables table or
// temporary directory the harness made is left over.
//
//	func TestMain(m *testing.M) { cluster.RunIsolated(m) }
func RunIsolated(m *testing.M, after ...func() error) {
	Isolate()
	code := m.Run()
	for _, step := range after {
		if err := step(); err != nil {
			fmt.Fprintf(os.Stderr, "cluster: after the tests: %v\n", err)
			code = max(code, 1)
		}
	}
	if Isolated() {
		if left := Leftovers(); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "cluster: left over after the tests:\n  %s\n", strings.Join(left, "\n  "))
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// Isolate re-executes the test binary under its own network, mount and PID namespaces and
// returns only inside them; the outer process exits with the tests' status. RunIsolated, Main
// and stack.Main call it first; a TestMain of its own or a program calls it itself:
//
//	func main() {
//		cluster.Isolate()
//		c, err := cluster.New(cluster.Options{KubeProxy: true})
//		...
//	}
//
// The test process, the API server, etcd, kube-proxy and anything started in-process share one
// network namespace, "the cluster namespace", which plays the nodes' host network. Nothing in
// it is linked to the machine's real network, so no packet can leave. When the tests end, or
// the binary is killed, the PID namespace and with it every process, network namespace and
// link the tests made disappear.
//
// Without root Isolate returns at once, and Start skips the tests that need a cluster.
//
// Isolate works the same at the start of a main program (e.g. one that keeps a cluster running
// until Ctrl-C). Ctrl-C reaches the isolated process directly (once); SIGTERM or SIGHUP sent to
// the outer process are passed on.
func Isolate() {
	switch os.Getenv(stageEnv) {
	case stageTest:
		return
	case stageInit:
		os.Exit(runInit())
	}
	if os.Geteuid() != 0 {
		notIsolatedReason = "not root"
		return
	}
	os.Exit(runOuter())
}

// runOuter starts the init stage in new namespaces and waits for it.
func runOuter() int {
	// Pdeathsig fires when the thread that started the child exits: keep this one.
	runtime.LockOSThread()
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "cluster: finding the test binary: %v\n", err)
		return 1
	}
	// The isolated binary's TMPDIR: init mounts a private tmpfs on it, so whatever the tests
	// leave there (control plane data, t.TempDir, database files) vanishes with the mount
	// namespace, also when the binary is killed. Only this empty directory is on the disk.
	tmp, err := os.MkdirTemp("", "swh-isolated-"+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "cluster: creating the isolated binary's temporary directory: %v\n", err)
		return 1
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(os.Environ(), stageEnv+"="+stageInit, outerPIDEnv+"="+strconv.Itoa(os.Getpid()),
		tmpDirEnv+"="+tmp, "TMPDIR="+tmp)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWNET | unix.CLONE_NEWNS | unix.CLONE_NEWPID,
		Pdeathsig:  syscall.SIGKILL,
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "cluster: starting the test binary in new network, mount and PID namespaces (needs CAP_SYS_ADMIN): %v\n", err)
		return 1
	}
	go func() {
		for s := range sigs {
			if forward(s) {
				_ = cmd.Process.Signal(s)
			}
		}
	}()
	err = cmd.Wait()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exitErr):
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return exitErr.ExitCode()
	default:
		fmt.Fprintf(os.Stderr, "cluster: waiting for the isolated test binary: %v\n", err)
		return 1
	}
}

// forward tells which signals the outer and init stages pass on to their child. SIGINT is
// caught (so they live until the child ends) but not passed on: Ctrl-C reaches every process of
// the terminal's foreground process group, the isolated ones included, and a program that
// handles SIGINT (`make run`) must see it once, not three times. SIGTERM and SIGHUP, sent to one
// process by kill or CI, are passed on.
func forward(s os.Signal) bool {
	return s != syscall.SIGINT
}

// runInit is PID 1 of the test's PID namespace.
func runInit() int {
	runtime.LockOSThread()
	if err := setupMounts(); err != nil {
		fmt.Fprintf(os.Stderr, "cluster: %v\n", err)
		return 1
	}
	if err := setupHostNetwork(); err != nil {
		fmt.Fprintf(os.Stderr, "cluster: building the cluster network namespace: %v\n", err)
		return 1
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "cluster: finding the test binary: %v\n", err)
		return 1
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(os.Environ(), stageEnv+"="+stageTest)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "cluster: starting the tests: %v\n", err)
		return 1
	}
	child := cmd.Process.Pid
	go func() {
		for s := range sigs {
			if forward(s) {
				_ = syscall.Kill(child, s.(syscall.Signal))
			}
		}
	}()
	// Reap every process (orphans are re-parented to us) until the tests' process ends. Our exit
	// then makes the kernel kill whatever is left in the PID namespace.
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "cluster: waiting for the tests: %v\n", err)
			return 1
		}
		if pid != child {
			continue
		}
		switch {
		case ws.Exited():
			return ws.ExitStatus()
		case ws.Signaled():
			fmt.Fprintf(os.Stderr, "cluster: the test process was killed by %v\n", ws.Signal())
			return 128 + int(ws.Signal())
		}
	}
}

// setupMounts gives the namespace its own /proc (of the new PID namespace), /sys (of the new
// network namespace), an empty /run/netns, so `ip netns` names never meet another package's, and
// a tmpfs on the binary's TMPDIR.
func setupMounts() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	// /sys shows the network devices of the namespace that mounts it; best effort, only
	// diagnostics read it.
	_ = unix.Mount("sysfs", "/sys", "sysfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", netnsDir, err)
	}
	if err := unix.Mount("tmpfs", netnsDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=1m"); err != nil {
		return fmt.Errorf("mounting a private %s: %w", netnsDir, err)
	}
	if tmp := os.Getenv(tmpDirEnv); tmp != "" {
		if err := unix.Mount("tmpfs", tmp, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
			return fmt.Errorf("mounting a private tmpfs on %s: %w", tmp, err)
		}
	}
	return nil
}

// setupHostNetwork builds the cluster namespace's network: lo, a veth pair whose both ends stay
// here, the gateway address and a default route through the pair's far end, which has no
// address and does not forward, so the route ends here.
func setupHostNetwork() error {
	cmds := []string{
		"link set lo up",
		"link add " + gatewayLink + " type veth peer name " + gatewayPeerLink,
		"addr add " + gatewayIP + "/24 dev " + gatewayLink,
	}
	// The traffic client's addresses: secondaries, never a default source.
	for i := range trafficClientAddrs {
		cmds = append(cmds, "addr add "+trafficClientAddr(i).String()+"/24 dev "+gatewayLink)
	}
	cmds = append(cmds, "link set "+gatewayLink+" up", "link set "+gatewayPeerLink+" up")
	if err := ipBatch("", cmds); err != nil {
		return err
	}
	// ip_forward lets pods reach each other through the cluster namespace. Writing it sets
	// every interface's forwarding, so switch the far end of the gateway pair off afterwards.
	if err := writeSysctl("net/ipv4/ip_forward", "1"); err != nil {
		return err
	}
	if err := writeSysctl("net/ipv4/conf/"+gatewayPeerLink+"/forwarding", "0"); err != nil {
		return err
	}
	return ipBatch("", []string{"route add default via " + blackholeNextHop + " dev " + gatewayLink})
}

func writeSysctl(name, value string) error {
	p := filepath.Join("/proc/sys", name)
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", p, err)
	}
	return nil
}

// Leftovers lists what the harness made that still exists: network namespaces, links other
// than lo and the gateway pair, processes other than this one and PID 1, nftables tables and
// temporary directories. It is empty after every cluster has stopped. RunIsolated calls it
// after the tests; a custom TestMain calls it after stopping its clusters. Outside an isolated
// binary it returns nil: there is nothing of ours to tell apart from the machine's own.
func Leftovers() []string {
	if !Isolated() {
		return nil
	}
	var left []string
	if entries, err := os.ReadDir(netnsDir); err == nil {
		for _, e := range entries {
			left = append(left, "network namespace "+e.Name())
		}
	}
	if links, err := linkNames(""); err != nil {
		left = append(left, "cannot list links: "+err.Error())
	} else {
		for _, l := range links {
			if l != "lo" && l != gatewayLink && l != gatewayPeerLink {
				left = append(left, "link "+l)
			}
		}
	}
	if procs, err := otherProcesses(); err != nil {
		left = append(left, "cannot list processes: "+err.Error())
	} else {
		left = append(left, procs...)
	}
	if out, err := exec.Command("nft", "list", "tables").CombinedOutput(); err != nil {
		left = append(left, "cannot list nftables tables: "+strings.TrimSpace(string(out)))
	} else if s := strings.TrimSpace(string(out)); s != "" {
		for _, l := range strings.Split(s, "\n") {
			left = append(left, "nftables "+l)
		}
	}
	for _, d := range tempDirs.list() {
		if _, err := os.Stat(d); err == nil {
			left = append(left, "temporary directory "+d)
		}
	}
	sort.Strings(left)
	return left
}

// otherProcesses lists the processes of the PID namespace other than init and this one.
func otherProcesses() ([]string, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("reading /proc: %w", err)
	}
	self := os.Getpid()
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == 1 || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue // gone meanwhile
		}
		out = append(out, fmt.Sprintf("process %d: %s", pid, strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))))
	}
	return out, nil
}
