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
// TIME-WAIT socket stays behind. The deadline is timeout from now, or ctx's when earlier; ctx's
// end also cuts the connect short.
//
// It is the agent's most frequent probe, so it takes no context, timer or allocation of its own
// where the connect is done when the system call returns (a local pod: on loopback and a veth
// the handshake completes within connect): connectAndReset (tcp_linux.go).
func (p *Prober) probeTCP(ctx context.Context, addr netip.AddrPort, timeout time.Duration) Result {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	return connectAndReset(ctx, addr, deadline, timeout)
}

// dialAndReset is probeTCP through net.Dialer (probeDialer): where connectAndReset is not
// available, and for addresses with a zone.
func dialAndReset(ctx context.Context, addr netip.AddrPort, deadline time.Time, timeout time.Duration) Result {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	c, err := dial(ctx, addr)
	if err != nil {
		return failure(netReason(ctx, err, timeout))
	}
	_ = c.Close()
	return success("connected")
}
