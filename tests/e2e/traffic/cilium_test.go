// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import "testing"

// The scenarios of this package on Cilium's dataplane: the same test code as their kube-proxy
// versions, on a stack whose cluster namespace runs a real cilium-agent (kube-proxy
// replacement, socket load balancer) instead of kube-proxy. WaitProgrammed reads Cilium's BPF
// service map, so every "the dataplane routes to exactly these pods" step is Cilium's own
// state. They run in `make test-cilium` (go test -run Cilium) and skip elsewhere.

// TestCiliumTheVMPodKeepsItsWebTrafficWhenSMTPStops: a pod failing one port keeps the others.
func TestCiliumTheVMPodKeepsItsWebTrafficWhenSMTPStops(t *testing.T) {
	vmPodKeepsItsWebTraffic(t, ciliumStack(t))
}

// TestCiliumDrainAnnotationLosesNoRequestAndKeepsConnections: a drained pod gets no new
// connection from Cilium, an established one finishes on it, the loop loses nothing.
func TestCiliumDrainAnnotationLosesNoRequestAndKeepsConnections(t *testing.T) {
	drainAnnotationLosesNoRequest(t, ciliumStack(t))
}

// TestCiliumAPodReplacedWithAGracefulDrainLosesNoRequest: a terminating pod of a rolling
// replacement finishes its requests and new connections go to the new pod.
func TestCiliumAPodReplacedWithAGracefulDrainLosesNoRequest(t *testing.T) {
	gracefulReplacementLosesNoRequest(t, ciliumStack(t))
}

// TestCiliumRestartsAndALeaderChangeChangeNothingForTraffic: agent restarts, a leader change
// and a rolling replacement of every agent flap nothing in Cilium's maps and fail no request.
func TestCiliumRestartsAndALeaderChangeChangeNothingForTraffic(t *testing.T) {
	restartsChangeNothingForTraffic(t, ciliumStack(t))
}
