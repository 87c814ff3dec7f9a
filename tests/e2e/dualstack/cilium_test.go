// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package dualstack_test

import "testing"

// TestCiliumAFailingPortWithdrawsThePodFromThatPortInBothFamilies is the failing-port scenario
// on Cilium's dataplane: the same test code on a dual-stack stack whose cluster namespace runs a
// real cilium-agent (IPv4 and IPv6 socket load balancing) instead of kube-proxy;
// WaitProgrammedOf reads Cilium's BPF service maps of each family. It runs in
// `make test-cilium` and skips elsewhere.
func TestCiliumAFailingPortWithdrawsThePodFromThatPortInBothFamilies(t *testing.T) {
	failingPortWithdrawsThePodInBothFamilies(t, sharedCilium.Get(t))
}
