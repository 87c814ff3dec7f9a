// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package crds installs and updates the module's CustomResourceDefinitions when the module
// starts, with module-sdk's common hook.
package crds

import (
	"os"
	"path/filepath"

	"github.com/deckhouse/module-sdk/common-hooks/ensure_crds"
)

// GlobEnv overrides where the CRD files are looked up (a filepath.Glob pattern).
const GlobEnv = "SWH_CRDS_GLOB"

// Glob is where the CRD files are. The bundle keeps crds/ beside hooks/, and the hooks binary
// lives in hooks/, so the default is found from the binary's own path: this does not depend on
// the working directory the platform starts the binary in. The common hook skips doc-ru-* files.
func Glob() string {
	if g := os.Getenv(GlobEnv); g != "" {
		return g
	}
	exe, err := os.Executable()
	if err != nil {
		return filepath.Join("..", "crds", "*.yaml")
	}
	return filepath.Join(filepath.Dir(exe), "..", "crds", "*.yaml")
}

var _ = ensure_crds.RegisterEnsureCRDsHookEM(Glob())
