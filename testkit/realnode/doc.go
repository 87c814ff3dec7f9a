// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package realnode runs real Kubernetes nodes for tests: per node a containerd and a kubelet
// with their own state directories and sockets, registered against the test cluster's API
// server with a node client certificate, pods networked by the CNI bridge plugin, and images
// built locally from static Go binaries (no registry is reachable on the test machines).
package realnode
