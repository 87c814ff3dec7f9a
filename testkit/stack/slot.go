// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package stack

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/deckhouse/service-with-healthchecks/testkit/loopback"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

// slot is one program the stack runs: a controller replica or a node's agent. Its name, flags,
// addresses and log file stay the same from run to run; proc is the current run, nil while the
// slot is stopped.
type slot struct {
	// name is "controller-<i>" or "agent-<node>": the log file's name and its marker lines'.
	name string
	// command is the program and flags of the next run, made from the slot's addresses when it
	// starts (the stack's programs can change between runs: UsePrograms).
	command     func(metricsAddr, healthAddr string) (bin string, args []string)
	metricsAddr string
	healthAddr  string
	logFile     string
	// ready is what being ready means beyond /readyz answering 200 (for an agent: its node
	// Lease renewed since this run started); nil for nothing more.
	ready func(ctx context.Context, p *process.Process) error

	// mu guards proc for the status reads (PIDs, Leader), which never wait for a start or stop;
	// the stack's ctl serializes the starts and stops themselves.
	mu   sync.Mutex
	proc *process.Process
}

// newSlot makes a stopped slot with its own free loopback addresses for /metrics and the
// health probes (every program shares the cluster namespace); command makes its program and
// flags from them at every start.
func newSlot(name, logDir string, command func(metricsAddr, healthAddr string) (string, []string)) (*slot, error) {
	addrs, err := loopback.FreeAddrs(2)
	if err != nil {
		return nil, err
	}
	metricsAddr, healthAddr := addrs[0], addrs[1]
	return &slot{name: name, command: command, metricsAddr: metricsAddr, healthAddr: healthAddr,
		logFile: filepath.Join(logDir, name+".log")}, nil
}

// running is the current run, nil while stopped or once it has exited.
func (sl *slot) running() *process.Process {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.proc != nil && !sl.proc.Exited() {
		return sl.proc
	}
	return nil
}

// pid is the current run's process id, 0 while stopped.
func (sl *slot) pid() int {
	if p := sl.running(); p != nil {
		return p.PID()
	}
	return 0
}

// launch starts a run without waiting for it: the program in its own process group (so a
// Ctrl-C in a terminal reaches only the program that owns the stack, which stops everything in
// order), its output appended to the slot's log file.
func (sl *slot) launch() (*process.Process, error) {
	bin, args := sl.command(sl.metricsAddr, sl.healthAddr)
	p, err := process.Start(sl.name, exec.Command(bin, args...), process.Options{LogFile: sl.logFile, Group: true})
	if err != nil {
		return nil, err
	}
	sl.mu.Lock()
	sl.proc = p
	sl.mu.Unlock()
	return p, nil
}

// waitReady waits, at most readyTimeout, until run p answers 200 on /readyz and meets the
// slot's ready condition; it fails at once when p exits.
func (sl *slot) waitReady(ctx context.Context, p *process.Process) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := p.WaitHTTP(ctx, "http://"+sl.healthAddr+"/readyz"); err != nil {
		return fmt.Errorf("waiting for %s to be ready: %w", sl.name, err)
	}
	if sl.ready != nil {
		return sl.ready(ctx, p)
	}
	return nil
}

// start starts a run (no-op while one runs) and waits until it is ready.
func (sl *slot) start(ctx context.Context) error {
	if sl.running() != nil {
		return nil
	}
	p, err := sl.launch()
	if err != nil {
		return err
	}
	return sl.waitReady(ctx, p)
}

// stop stops the current run (SIGTERM, SIGKILL after 30 s) and waits until it has exited.
func (sl *slot) stop() error {
	sl.mu.Lock()
	p := sl.proc
	sl.mu.Unlock()
	if p == nil {
		return nil
	}
	err := p.Stop()
	sl.mu.Lock()
	sl.proc = nil
	sl.mu.Unlock()
	return err
}

// restart stops the current run and starts a new one, waiting until it is ready.
func (sl *slot) restart(ctx context.Context) error {
	if err := sl.stop(); err != nil {
		return err
	}
	return sl.start(ctx)
}

// poll calls fn every interval until it returns true or an error, or ctx ends.
func poll(ctx context.Context, interval time.Duration, fn func() (bool, error)) error {
	for {
		ok, err := fn()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}
