// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package postgres_test

import "testing"

// TestCiliumDBWriteNewConnectionsReachOnlyTheNewPrimaryAfterAFailover is scenario 1 on Cilium's
// dataplane: the same test code on a stack whose cluster namespace runs a real cilium-agent
// (kube-proxy replacement, socket load balancer) instead of kube-proxy; waitRouted reads
// Cilium's BPF service map. It runs in `make test-cilium` and skips elsewhere.
func TestCiliumDBWriteNewConnectionsReachOnlyTheNewPrimaryAfterAFailover(t *testing.T) {
	failoverDBWrite(t, sharedCilium.Get(t))
}
