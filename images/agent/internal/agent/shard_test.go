// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
)

// The package's tests spend their time waiting (probe periods, graces, API freezes: about 210 s
// of which 27 s are CPU, development/BENCHMARKS-HISTORY.md, "`make test`: the agent's tests in
// two processes"). A plain run of the package (no -run, -skip, profile or race build) therefore
// runs as two processes side by side, each its own isolated binary with its own cluster: the
// tests that run the controller program (liveness, the probe budget's report: they freeze the
// API server or wait out graces), with two of the longest others to even the halves out, in
// one, every other test in the other. Each test runs exactly once; the package passes when both
// pass. shardEnv tells a process which part it runs. `-skip '^$'` runs the package in one
// process (it skips nothing).
const shardEnv = "SWH_AGENT_TEST_SHARD"

// The values of shardEnv.
const (
	shardController = "controller"
	shardRest       = "rest"
)

// controllerTests matches the tests of the controller shard: those that run the controller
// program (about 85 s) and two of the longest others (about 23 s), so that both shards take
// about 105 s.
const controllerTests = `^(TestAStoppedAgentsEndpointsAreWithdrawnAfterTheGraceAndReturnWithIt` +
	`|TestAnAPIOutageWithdrawsNothingAndTheAgentsPublishAfterIt` +
	`|TestMoreThanHalfOfTheAgentsStoppedAtOnceWithdrawsNothingAndTheGuardSaysWhy` +
	`|TestALeaderThatLosesItsLeaseInAnAPIFreezeRestartsAndWithdrawsNothing` +
	`|TestBudgetOverBudgetNamespaceIsReportedAndTheVictimIsServed` +
	`|TestReadinessEventsAreRateLimitedPerPod` +
	`|TestARestartedAgentAdoptsItsSlicesWithoutFlapping)$`

// shardFlags are the test flags under which the package runs in one process: a selection
// (-run, -skip, -list) is the caller's, and two processes would write one profile twice.
var shardFlags = []string{"test.run", "test.skip", "test.list", "test.bench", "test.fuzz", "test.coverprofile",
	"test.cpuprofile", "test.memprofile", "test.blockprofile", "test.mutexprofile", "test.trace"}

// shard runs the package as two processes when it may (see above) and returns their status
// (ran true); in a shard's process it selects that shard's tests and returns ran false, and
// TestMain goes on as in a single process.
func shard() (code int, ran bool) {
	switch os.Getenv(shardEnv) {
	case shardController:
		mustSet("test.run", controllerTests)
		return 0, false
	case shardRest:
		mustSet("test.skip", controllerTests)
		return 0, false
	}
	if !flag.Parsed() {
		flag.Parse()
	}
	if raceBuild || os.Geteuid() != 0 {
		return 0, false
	}
	for _, name := range shardFlags {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return 0, false
		}
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "agent tests: finding the test binary: %v\n", err)
		return 1, true
	}
	// Pdeathsig fires when the thread that started the child exits: keep this one, so that a
	// killed test binary (go test's -timeout) takes both shards with it.
	runtime.LockOSThread()
	shards := []string{shardController, shardRest}
	cmds := make([]*exec.Cmd, 0, len(shards))
	for _, s := range shards {
		cmd := exec.Command(exe, os.Args[1:]...) //nolint:gosec // this test binary
		cmd.Args[0] = os.Args[0]
		cmd.Env = append(os.Environ(), shardEnv+"="+s)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(os.Stderr, "agent tests: starting the %s shard: %v\n", s, err)
			code = 1
			continue
		}
		cmds = append(cmds, cmd)
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				fmt.Fprintf(os.Stderr, "agent tests: waiting for a shard: %v\n", err)
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
