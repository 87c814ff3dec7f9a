// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package docs

import (
	"testing"

	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

var env *controlplane.Env

func TestMain(m *testing.M) { controlplane.Main(m, controlplane.Options{}, &env) }
