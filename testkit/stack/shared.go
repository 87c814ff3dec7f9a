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
	// mu guards started, s and err: the stack is started once, or again after release.
	mu      sync.Mutex
	started bool
	s       *Stack
	err     error
	// other is the Shared of the other dataplane (MainDataplanes): the two share the cluster
	// namespace, so Get stops the other's stack before it starts its own.
	other *Shared
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
	if sh.opts.Cilium && !cluster.CiliumEnabled() {
		t.Skipf("the Cilium dataplane runs in `make test-cilium` (%s=1)", cluster.CiliumEnv)
	}
	if sh.other != nil {
		if err := sh.other.release(); err != nil {
			t.Fatalf("stopping the other dataplane's stack: %v", err)
		}
	}
	sh.mu.Lock()
	if !sh.started {
		sh.started = true
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		sh.s, sh.err = New(ctx, sh.opts)
		cancel()
	}
	sh.mu.Unlock()
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
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.s == nil {
		return nil
	}
	err := sh.s.Stop()
	sh.s = nil
	if err != nil {
		return fmt.Errorf("stopping the shared stack: %w", err)
	}
	return nil
}

// release stops the stack once no test holds it, so that a later Get starts it again.
func (sh *Shared) release() error {
	sh.inUse.Lock()
	defer sh.inUse.Unlock()
	err := sh.stop()
	sh.mu.Lock()
	sh.started, sh.err = false, nil
	sh.mu.Unlock()
	return err
}

// MainDataplanes is Main for a package whose scenarios run on both dataplanes, the same test
// code with the stack as a parameter: kubeProxy gets opts, cilium opts with Cilium set (its
// tests skip unless cluster.CiliumEnabled; with NodeKubeProxies every node runs a cilium-agent). The two stacks share the cluster namespace, so only
// one runs at a time: Get on one stops the other first (keep each dataplane's tests together,
// so the switch happens once). Both are stopped after the tests.
//
//	var shared, sharedCilium stack.Shared
//
//	func TestMain(m *testing.M) { stack.MainDataplanes(m, stack.Options{}, &shared, &sharedCilium) }
func MainDataplanes(m *testing.M, opts Options, kubeProxy, cilium *Shared) {
	kubeProxy.opts = opts
	ciliumOpts := opts
	ciliumOpts.Cilium = true
	cilium.opts = ciliumOpts
	kubeProxy.other, cilium.other = cilium, kubeProxy
	cluster.RunIsolated(m, kubeProxy.stop, cilium.stop)
}
