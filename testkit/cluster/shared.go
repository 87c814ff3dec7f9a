// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"errors"
	"fmt"
	"sync"
	"testing"
)

// Shared is one cluster shared by the tests of a package: the first test that asks for it
// (Get) starts it, Main stops it after the last test. Each test uses its own Kubernetes
// namespace. A zero Shared is ready for Main.
type Shared struct {
	opts Options
	once sync.Once
	c    *Cluster
	err  error
}

// Main is the whole TestMain of a package whose tests share one cluster: RunIsolated, with the
// shared cluster (started with opts by the first test that calls shared.Get) stopped after the
// tests and before the check for leftovers.
//
//	var shared cluster.Shared
//
//	func TestMain(m *testing.M) { cluster.Main(m, cluster.Options{KubeProxy: true}, &shared) }
//
//	func TestSomething(t *testing.T) {
//		c := shared.Get(t) // skips without root
//		ns := c.Env.CreateNamespaceForTest(t, "something")
//		...
//	}
func Main(m *testing.M, opts Options, shared *Shared) {
	shared.opts = opts
	RunIsolated(m, shared.stop)
}

// Get returns the shared cluster, starting it on first use. It skips the test without root and
// fails it when the cluster could not start.
func (sh *Shared) Get(t testing.TB) *Cluster {
	t.Helper()
	sh.once.Do(func() { sh.c, sh.err = New(sh.opts) })
	if errors.Is(sh.err, ErrNotRoot) {
		t.Skipf("cluster: %v", sh.err)
	}
	if sh.err != nil {
		t.Fatalf("starting the shared cluster: %v", sh.err)
	}
	return sh.c
}

func (sh *Shared) stop() error {
	if sh.c == nil {
		return nil
	}
	if err := sh.c.Stop(); err != nil {
		return fmt.Errorf("stopping the shared cluster: %w", err)
	}
	return nil
}
