// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster_test

import (
	"testing"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

func TestMain(m *testing.M) { cluster.RunIsolated(m) }
