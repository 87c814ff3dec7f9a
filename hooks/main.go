// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Command hooks is the module's hooks binary: Deckhouse runs it to list, configure and run the
// Go hooks registered by the blank-imported packages.
package main

import (
	"github.com/deckhouse/module-sdk/pkg/app"

	_ "github.com/deckhouse/service-with-healthchecks/hooks/crds"
	_ "github.com/deckhouse/service-with-healthchecks/hooks/credentials"
	_ "github.com/deckhouse/service-with-healthchecks/hooks/settings"
)

func main() {
	app.Run()
}
