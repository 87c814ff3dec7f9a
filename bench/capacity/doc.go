// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package capacity holds the kubelet side and the floor of the probe capacity benchmark
// (bench/capacity/run.sh): the kubelet's own probe code (k8s.io/kubernetes/pkg/probe/tcp and
// http) driven the way the kubelet drives it (one goroutine with a ticker per probe,
// BenchmarkKubeletCapacity), and the physical floor, one thread making only the system calls a
// probe needs (BenchmarkFloorCapacity), against the same target server (./server) and measured
// the same way as the agent's BenchmarkCapacity (images/agent/internal/scheduler). This module
// stays outside go.work: it pulls k8s.io/kubernetes.
package capacity
