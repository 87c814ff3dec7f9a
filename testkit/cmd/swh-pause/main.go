// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Command swh-pause is the pod sandbox's process on real test nodes (testkit/realnode): it holds
// the pod's namespaces open until it is told to stop, as the upstream pause image does. It is
// packed into a local OCI image because no registry is reachable from the test machines.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
