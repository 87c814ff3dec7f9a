// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package shard runs a test binary's tests as two processes side by side: the tests a pattern
// selects in one, every other test in the other. It is for packages whose tests spend their
// time waiting (probe periods, graces, upgrades under traffic), not computing, and whose run is
// the tail of `make test` (development/TEST-HARNESS.md, "Packages in two processes"). Each
// process is the package's test binary as `go test` started it, so each isolates itself
// (cluster.RunIsolated) and starts its own cluster; each test runs exactly once; the package
// passes when both processes pass.
//
// Call Run first in TestMain, after whatever must happen once for both (it is inherited through
// the environment):
//
//	func TestMain(m *testing.M) {
//		if code, ran := shard.Run("SWH_MY_TEST_SHARD", `^(TestA|TestB)$`); ran {
//			os.Exit(code)
//		}
//		cluster.RunIsolated(m)
//	}
//
// The package runs in one process, as before, when the caller selected tests or asked for a
// profile (-run, -skip, -list, -bench, -fuzz, a profile flag: two processes would write one
// profile twice), without root (no cluster: the tests skip), and under the race detector
// (hack/test-race.sh runs its own parallelism; a race binary's memory is several times a plain
// one's).
package shard

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
)

// The two processes, as the value of the caller's environment variable.
const (
	// Selected runs the tests the pattern selects (-test.run).
	Selected = "selected"
	// Rest runs every other test (-test.skip).
	Rest = "rest"
)

// oneProcessFlags are the test flags under which a package runs in one process: a selection is
// the caller's, and two processes would write one profile twice.
var oneProcessFlags = []string{"test.run", "test.skip", "test.list", "test.bench", "test.fuzz", "test.coverprofile",
	"test.cpuprofile", "test.memprofile", "test.blockprofile", "test.mutexprofile", "test.trace"}

// Run splits the package by pattern (a -test.run expression matching top-level test names)
// and tells the caller what to do. In the process `go test` started it runs the two shards and
// returns their status with ran true: TestMain exits with code. In a shard's process it selects
// that shard's tests and returns ran false, and TestMain goes on as in a single process; so it
// does when the package runs in one process (see the package comment). env names the package's
// own variable, so that a package's shards never pass their selection on to another package's
// binary they start.
func Run(env, pattern string) (code int, ran bool) {
	switch os.Getenv(env) {
	case Selected:
		mustSet("test.run", pattern)
		return 0, false
	case Rest:
		mustSet("test.skip", pattern)
		return 0, false
	}
	if !flag.Parsed() {
		flag.Parse()
	}
	if raceBuild || os.Geteuid() != 0 {
		return 0, false
	}
	for _, name := range oneProcessFlags {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return 0, false
		}
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "shard: finding the test binary: %v\n", err)
		return 1, true
	}
	// Pdeathsig fires when the thread that started the child exits: keep this one, so that a
	// killed test binary (go test's -timeout) takes both shards with it.
	runtime.LockOSThread()
	cmds := make([]*exec.Cmd, 0, 2)
	for _, s := range []string{Selected, Rest} {
		cmd := exec.Command(exe, os.Args[1:]...) //nolint:gosec // this test binary
		cmd.Args[0] = os.Args[0]
		cmd.Env = append(os.Environ(), env+"="+s)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(os.Stderr, "shard: starting the %s shard: %v\n", s, err)
			code = 1
			continue
		}
		cmds = append(cmds, cmd)
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				fmt.Fprintf(os.Stderr, "shard: waiting for a shard: %v\n", err)
			}
			code = max(code, 1)
		}
	}
	return code, true
}

func mustSet(name, value string) {
	if err := flag.Set(name, value); err != nil {
		panic(fmt.Sprintf("setting -%s: %v", name, err))
	}
}
