// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package loopback_test

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/testkit/loopback"
)

func TestFreeAddrHandsOutBindablePortsNeverTwice(t *testing.T) {
	seen := map[string]bool{}
	for range 50 {
		addr, err := loopback.FreeAddr()
		require.NoError(t, err)
		require.False(t, seen[addr], "%s was handed out twice", addr)
		seen[addr] = true
		l, err := net.Listen("tcp4", addr)
		require.NoError(t, err, "the address is free")
		require.NoError(t, l.Close())
	}
}
