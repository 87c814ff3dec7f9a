// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package stack

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// Shared is one stack shared by the tests of a package: the first test that asks for it (Get)
// starts it, Main stops it after the last test. Each test uses its own Kubernetes namespace and
// holds the stack alone while it runs (tests that restart programs change what others see). A
// zero Shared is ready for Main.
type Shared struct {
	opts Options
	once sync.Once
	s    *Stack
	err  error
	// inUse is held by the test that uses the stack, from Get to the test's end.
	inUse sync.Mutex
}

// Main is the whole TestMain of a package whose tests share one stack, like controlplane.Main:
// the binary is isolated (cluster.RunIsolated), the stack (started with opts by the first test
// that calls shared.Get) is stopped after the tests, and anything left over fails the package.
//
//	var shared stack.Shared
//
//	func TestMain(m *testing.M) { stack.Main(m, stack.Options{}, &shared) }
//
//	func TestSomething(t *testing.T) {
//		s := shared.Get(t) // skips without root
//		ns := s.Cluster.Env.CreateNamespaceForTest(t, "something")
//		...
//	}
func Main(m *testing.M, opts Options, shared *Shared) {
	shared.opts = opts
	cluster.RunIsolated(m, shared.stop)
}

// Get returns the shared stack, starting it on first use (New, within 5 minutes), and holds it
// for this test until the test ends; the programs' logs (the last 32 KiB of each) are printed
// when the test failed. It skips the test without root and fails it when the stack could not
// start.
func (sh *Shared) Get(t testing.TB) *Stack {
	t.Helper()
	cluster.SkipUnlessIsolated(t)
	sh.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		sh.s, sh.err = New(ctx, sh.opts)
	})
	if errors.Is(sh.err, cluster.ErrNotRoot) {
		t.Skipf("stack: %v", sh.err)
	}
	if sh.err != nil {
		t.Fatalf("starting the shared stack: %v", sh.err)
	}
	sh.inUse.Lock()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("programs' logs (from %s):\n%s", sh.s.LogDir, sh.s.Logs(32<<10))
		}
		sh.inUse.Unlock()
	})
	return sh.s
}

func (sh *Shared) stop() error {
	if sh.s == nil {
		return nil
	}
	if err := sh.s.Stop(); err != nil {
		return fmt.Errorf("stopping the shared stack: %w", err)
	}
	return nil
}
