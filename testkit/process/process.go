// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package process runs programs for tests, benchmarks and `make run`: one runner for every
// program the harness starts (the product's programs, kube-proxy, kube-controller-manager,
// servers inside pods). A program's output goes to a log file (with lines that mark each start,
// its PID and its exit) or to memory; it is stopped by its own PID (or its own process group)
// with SIGTERM, then killed after a grace; and its exit and the end of its output can be read
// for error messages. Build builds a program of the repository once per process.
package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ErrDataRace is what Stop wraps when a program built with -race (Build in a test binary built
// with -race) exited with the race detector's status: it found a data race.
var ErrDataRace = errors.New("the race detector found a data race")

// raceExitCode is the status a program built with -race exits with when it found a race
// (GORACE's exitcode, 66 unless set).
const raceExitCode = 66

// DefaultGrace is how long a program may take to exit after SIGTERM before it is killed.
const DefaultGrace = 30 * time.Second

// Options change how a program runs.
type Options struct {
	// LogFile receives the program's output, appended, after a line that names the program and
	// its arguments and one with its PID; a last line records its exit. Empty: the output is kept
	// in memory, unless the command's Stdout or Stderr is already set, which is then left alone.
	LogFile string
	// Grace is how long Stop waits after SIGTERM before it kills the program (default 30 s).
	Grace time.Duration
	// Group gives the program its own process group and sends Stop's signals to that group, so
	// they reach the children of a wrapper (nsenter, runuser) too, and a Ctrl-C in a terminal
	// reaches only the program that owns this one; whatever is left of the group after the
	// program exited is killed.
	Group bool
}

// Process is one run of a program.
type Process struct {
	name    string
	cmd     *exec.Cmd
	opts    Options
	started time.Time
	log     *os.File      // LogFile, closed once the program has exited
	out     *syncBuffer   // the output when it is kept in memory
	done    chan struct{} // closed once the program has exited and been reaped
	err     error         // cmd.Wait's result, set before done closes
}

// Start starts cmd (not yet started) as the program called name, which error messages and the
// log file's marker lines use.
func Start(name string, cmd *exec.Cmd, opts Options) (*Process, error) {
	if opts.Grace <= 0 {
		opts.Grace = DefaultGrace
	}
	p := &Process{name: name, cmd: cmd, opts: opts, done: make(chan struct{})}
	switch {
	case opts.LogFile != "":
		f, err := os.OpenFile(opts.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("opening the log of %s: %w", name, err)
		}
		p.log = f
		cmd.Stdout, cmd.Stderr = f, f
	case cmd.Stdout == nil && cmd.Stderr == nil:
		p.out = &syncBuffer{}
		cmd.Stdout, cmd.Stderr = p.out, p.out
	}
	if opts.Group {
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.Setpgid = true
	}
	p.started = time.Now()
	p.mark("%s %v (%s)", cmd.Path, cmd.Args[1:], p.started.Format(time.RFC3339Nano))
	if err := cmd.Start(); err != nil {
		if p.log != nil {
			_ = p.log.Close()
		}
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p.mark("pid %d", cmd.Process.Pid)
	go func() {
		p.err = cmd.Wait()
		p.mark("pid %d exited: %s", cmd.Process.Pid, exitText(p.err))
		if p.log != nil {
			_ = p.log.Close()
		}
		close(p.done)
	}()
	return p, nil
}

// StartForTest starts cmd with Options{} (output kept in memory unless cmd's Stdout or Stderr
// is set) and returns it. When the test ends it stops the program (SIGTERM, SIGKILL after 30 s);
// when the test failed, it logs the output under name.
func StartForTest(t testing.TB, name string, cmd *exec.Cmd) *Process {
	t.Helper()
	p, err := Start(name, cmd, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); errors.Is(err, ErrDataRace) {
			t.Error(err)
		} else if err != nil {
			t.Log(err)
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.Output(1<<20))
		}
	})
	return p
}

// mark writes a marker line into the log file, if there is one.
func (p *Process) mark(format string, args ...any) {
	if p.log != nil {
		_, _ = fmt.Fprintf(p.log, "--- %s: %s\n", p.name, fmt.Sprintf(format, args...))
	}
}

// Name is the name the program was started as.
func (p *Process) Name() string { return p.name }

// PID is the program's process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Started is when the program was started (taken just before it started).
func (p *Process) Started() time.Time { return p.started }

// Done is closed once the program has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the program has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is nil while the program runs, and an error that names it, its PID, how it exited and
// the end of its output once it has exited: for the polls that wait for a running program.
func (p *Process) Err() error {
	if !p.Exited() {
		return nil
	}
	return fmt.Errorf("%s (pid %d) exited: %s; its output ends with:\n%s", p.name, p.PID(), exitText(p.err), p.Output(4<<10))
}

// ExitText tells how the program exited ("status 0", "exit status 1", "signal: killed"), or ""
// while it runs.
func (p *Process) ExitText() string {
	if !p.Exited() {
		return ""
	}
	return exitText(p.err)
}

func exitText(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}

// Output is the last limit bytes of the program's output: of its log file, or of what was kept
// in memory; "" when the output went to writers of the caller's.
func (p *Process) Output(limit int64) string {
	switch {
	case p.opts.LogFile != "":
		return Tail(p.opts.LogFile, limit)
	case p.out != nil:
		return tailString(p.out.String(), limit)
	}
	return ""
}

// Stop sends SIGTERM to the program (its PID, or its group with Options.Group), waits up to
// the grace, then kills it, and returns once it has exited. A program that had to be killed is
// an error; one that exited before is not, unless the race detector made it exit (ErrDataRace,
// in a test binary built with -race).
func (p *Process) Stop() error {
	var err error
	if !p.Exited() {
		if serr := p.signal(syscall.SIGTERM); serr != nil && !errors.Is(serr, os.ErrProcessDone) && !errors.Is(serr, syscall.ESRCH) {
			err = fmt.Errorf("stopping %s (pid %d): %w", p.name, p.PID(), serr)
		}
		select {
		case <-p.done:
		case <-time.After(p.opts.Grace):
			_ = p.signal(syscall.SIGKILL)
			<-p.done
			err = fmt.Errorf("%s (pid %d) did not exit within %s of SIGTERM and was killed", p.name, p.PID(), p.opts.Grace)
		}
	}
	if p.opts.Group {
		// Children that outlived the group's leader.
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	}
	var exitErr *exec.ExitError
	if raceBuild && errors.As(p.err, &exitErr) && exitErr.ExitCode() == raceExitCode {
		err = errors.Join(err, fmt.Errorf("%s (pid %d): %w; its output ends with:\n%s", p.name, p.PID(), ErrDataRace, p.Output(16<<10)))
	}
	return err
}

func (p *Process) signal(sig syscall.Signal) error {
	if p.opts.Group {
		return syscall.Kill(-p.PID(), sig)
	}
	return p.cmd.Process.Signal(sig)
}

// WaitHTTP polls url every 50 ms until it answers 200. It fails when the program exits first
// (Err) or ctx ends.
func (p *Process) WaitHTTP(ctx context.Context, url string) error {
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	for {
		if err := p.Err(); err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := hc.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s of %s to answer 200: %w", url, p.name, ctx.Err())
		case <-p.done:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// syncBuffer is a bytes.Buffer that the program's output copier and its readers may share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
