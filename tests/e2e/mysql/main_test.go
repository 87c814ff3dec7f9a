// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package mysql_test holds the end-to-end scenarios of mode: MySQL (issue 29 part 3): the real
// programs (controllers and one agent per node, as processes, from testkit/stack) on the cluster
// harness with a real kube-proxy, a real MariaDB primary in pod db-0 on node-a and its replica
// (replication for real, read_only=1) in pod db-1 on node-b, the mysql-db-write and
// mysql-db-read resources and the credential Secret exactly as docs/EXAMPLES.md shows them, and
// MySQL request loops through each Service's ClusterIP whose every reply names the pod whose
// server answered (cluster.MySQL).
//
//   - A failover (the replica made writable, the old primary read-only): mysql-db-write follows
//     the writable server, and not one read through mysql-db-read fails.
//   - A wrong password and an unreachable server show as clear reasons in the resource's Events.
package mysql_test

import (
	"testing"

	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

// shared is one stack for the tests; each uses its own Kubernetes namespace and servers.
var shared stack.Shared

// TestMain isolates the binary (own network, mount and PID namespaces), stops the shared stack
// after the tests and fails the package if they leave anything.
func TestMain(m *testing.M) { stack.Main(m, stack.Options{}, &shared) }

func testStack(t testing.TB) *stack.Stack {
	t.Helper()
	return shared.Get(t)
}
