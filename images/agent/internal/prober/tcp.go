// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"context"
	"net/netip"
	"time"
)

// probeTCP connects and closes at once, sending nothing: a payload can disturb protocols that
// speak first or count bad input (SMTP, databases). Closing with SO_LINGER 0 sends RST, so no
// TIME-WAIT socket stays behind.
func (p *Prober) probeTCP(ctx context.Context, addr netip.AddrPort, timeout time.Duration) Result {
	c, err := dial(ctx, addr)
	if err != nil {
		return failure(netReason(ctx, err, timeout))
	}
	_ = c.Close()
	return success("connected")
}
