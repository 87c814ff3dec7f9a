// Package process runs programs for tests: their output is kept, and they are stopped (by
// their own PID) when the test ends.
package process

import (
	"bytes"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// stopGrace is how long a program may take to exit after SIGTERM before it is killed.
const stopGrace = 30 * time.Second

// StartForTest starts cmd with its standard output and error captured. When the test ends it
// sends SIGTERM, waits up to 30 s, then kills it; when the test failed, it logs the output under
// name.
func StartForTest(t testing.TB, name string, cmd *exec.Cmd) {
	t.Helper()
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(stopGrace):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, out.String())
		}
	})
}

// syncBuffer is a bytes.Buffer that the program's output copier and the test may share.
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
