package cluster_test

import (
	"testing"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

func TestMain(m *testing.M) { cluster.RunIsolated(m) }
