package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

// stopGrace is how long a program may take to exit after SIGTERM before it is killed.
const stopGrace = 30 * time.Second

// Binaries are the paths of the programs the stack runs.
type Binaries struct {
	// Controller is images/controller/cmd/controller.
	Controller string
	// Agent is images/agent/cmd/agent.
	Agent string
}

var (
	buildOnce sync.Once
	built     Binaries
	buildErr  error
)

// PrebuiltEnv names a folder that already holds `controller` and `agent` binaries; when set,
// Build uses them instead of building.
const PrebuiltEnv = "SWH_STACK_BIN_DIR"

// Build builds the controller and agent programs once per process (`go build` in the
// repository's workspace, into a temporary folder) and returns their paths.
func Build() (Binaries, error) {
	buildOnce.Do(func() { built, buildErr = build() })
	return built, buildErr
}

func build() (Binaries, error) {
	if dir := os.Getenv(PrebuiltEnv); dir != "" {
		b := Binaries{Controller: filepath.Join(dir, "controller"), Agent: filepath.Join(dir, "agent")}
		for _, p := range []string{b.Controller, b.Agent} {
			if _, err := os.Stat(p); err != nil {
				return Binaries{}, fmt.Errorf("$%s: %w", PrebuiltEnv, err)
			}
		}
		return b, nil
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		return Binaries{}, err
	}
	// go build skips linking when its -o target is up to date, so the programs are built into
	// one cache folder (outside the checkout; a lock keeps parallel test binaries apart) and
	// copied from there into this process's own folder, which a later rebuild cannot touch.
	cache, err := os.UserCacheDir()
	if err != nil {
		return Binaries{}, fmt.Errorf("finding the cache folder: %w", err)
	}
	cacheDir := filepath.Join(cache, "service-with-healthchecks", "stack-bin")
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return Binaries{}, fmt.Errorf("creating %s: %w", cacheDir, err)
	}
	dir, err := os.MkdirTemp("", "swh-stack-bin-")
	if err != nil {
		return Binaries{}, fmt.Errorf("creating the binaries' folder: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(cacheDir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return Binaries{}, fmt.Errorf("opening the build lock: %w", err)
	}
	defer func() { _ = lock.Close() }()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return Binaries{}, fmt.Errorf("locking %s: %w", cacheDir, err)
	}
	b := Binaries{Controller: filepath.Join(dir, "controller"), Agent: filepath.Join(dir, "agent")}
	for _, p := range []struct{ module, pkg, name, out string }{
		{"images/controller", "./cmd/controller", "controller", b.Controller},
		{"images/agent", "./cmd/agent", "agent", b.Agent},
	} {
		cached := filepath.Join(cacheDir, p.name)
		cmd := exec.Command("go", "build", "-o", cached, p.pkg)
		cmd.Dir = filepath.Join(root, p.module)
		if out, err := cmd.CombinedOutput(); err != nil {
			return Binaries{}, fmt.Errorf("building %s/%s: %w: %s", p.module, p.pkg, err, out)
		}
		if err := copyFile(cached, p.out); err != nil {
			return Binaries{}, err
		}
	}
	return b, nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("copying %s: %w", from, err)
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return fmt.Errorf("copying %s: %w", from, err)
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return fmt.Errorf("copying %s to %s: %w", from, to, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("copying %s to %s: %w", from, to, err)
	}
	return nil
}

// proc is one run of a program: its output appended to a log file, stopped by its own PID.
type proc struct {
	name    string
	cmd     *exec.Cmd
	log     *os.File
	started time.Time
	done    chan struct{}
	err     error // set before done closes
}

// startProc starts bin with args, appending its output to logPath (a header line marks each
// start). The program gets its own process group, so a Ctrl-C in the terminal reaches only the
// program that owns the stack, which then stops everything in order.
func startProc(name, bin string, args []string, logPath string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the log of %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...) //nolint:gosec // our own programs
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &proc{name: name, cmd: cmd, log: f, started: time.Now(), done: make(chan struct{})}
	_, _ = fmt.Fprintf(f, "--- %s: %s %v (%s)\n", name, bin, args, p.started.Format(time.RFC3339Nano))
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	_, _ = fmt.Fprintf(f, "--- %s: pid %d\n", name, cmd.Process.Pid)
	go func() {
		p.err = cmd.Wait()
		_, _ = fmt.Fprintf(f, "--- %s: pid %d exited: %v\n", name, cmd.Process.Pid, exitText(p.err))
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

func exitText(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}

// pid is the process id.
func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process (by its PID), waits up to stopGrace, then kills it.
func (p *proc) stop() error {
	if p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stopping %s (pid %d): %w", p.name, p.pid(), err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(stopGrace):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s (pid %d) did not exit within %s of SIGTERM and was killed", p.name, p.pid(), stopGrace)
	}
}

// ports hands out loopback ports for the programs' metrics and health endpoints: a free port
// the kernel picks, never the same one twice in this process.
var ports = struct {
	sync.Mutex
	used map[int]bool
}{used: map[int]bool{}}

func freeLoopbackAddr() (string, error) {
	ports.Lock()
	defer ports.Unlock()
	for range 100 {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return "", fmt.Errorf("finding a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if !ports.used[port] {
			ports.used[port] = true
			return "127.0.0.1:" + strconv.Itoa(port), nil
		}
	}
	return "", errors.New("finding a free port: every port the kernel offered was used before")
}

// tail returns the last max bytes of a file.
func tail(path string, max int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return err.Error()
	}
	off := st.Size() - max
	prefix := ""
	if off > 0 {
		prefix = "[...]\n"
	} else {
		off = 0
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return err.Error()
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return err.Error()
	}
	return prefix + string(b)
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
