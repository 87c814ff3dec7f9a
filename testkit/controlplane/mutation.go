// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"fmt"
	"os"
	"syscall"
)

// CacheMutationDetectorEnv is client-go's switch of the informer-cache mutation detector: with
// it true, every informer keeps a deep copy of each object it adds and panics when the cached
// object no longer equals its copy (checked every second, for two to four minutes after the
// add). client-go reads it once, when the binary starts (a package init).
const CacheMutationDetectorEnv = "KUBE_CACHE_MUTATION_DETECTOR"

// DetectCacheMutations turns the informer-cache mutation detector on for this test binary: the
// first call of a TestMain whose tests run code that reads an informer's cache without copies
// (client.UnsafeDisableDeepCopy, an informer's indexer). When the variable is unset, it
// re-executes the binary in place (execve: same PID, arguments and the rest of the
// environment) with it set to true, since client-go has already read it by the time TestMain
// runs; set to anything (KUBE_CACHE_MUTATION_DETECTOR=false to measure without it), it is left
// as it is and the call returns.
func DetectCacheMutations() {
	if _, set := os.LookupEnv(CacheMutationDetectorEnv); set {
		return
	}
	exe, err := os.Executable()
	if err == nil {
		err = syscall.Exec(exe, os.Args, append(os.Environ(), CacheMutationDetectorEnv+"=true"))
	}
	fmt.Fprintf(os.Stderr, "controlplane: re-executing the test binary with %s=true: %v\n", CacheMutationDetectorEnv, err)
	os.Exit(1)
}
