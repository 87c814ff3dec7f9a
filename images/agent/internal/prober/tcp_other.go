// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build !linux

package prober

import (
	"context"
	"net/netip"
	"time"
)

// connectAndReset is dialAndReset where the agent does not run (it runs on Linux only); it
// keeps the package building for development elsewhere.
func connectAndReset(ctx context.Context, addr netip.AddrPort, deadline time.Time, timeout time.Duration) Result {
	return dialAndReset(ctx, addr, deadline, timeout)
}
