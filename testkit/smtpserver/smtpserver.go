// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package smtpserver is the SMTP-like dialogue of the test servers: a `220` banner naming the
// server, then one reply per command line (HELO/EHLO, NOOP/RSET, QUIT; anything else 502). The
// namespace-pod servers (testkit/cluster) and the image's server (cmd/swh-testserver) both
// speak it, so a probe's banner check behaves alike on both kinds of node.
package smtpserver

import (
	"bufio"
	"fmt"
	"net"
	"strings"
)

// Serve greets c as name and answers its commands until the client quits, hangs up or a write
// fails. It does not close c.
func Serve(c net.Conn, name string) {
	if _, err := fmt.Fprintf(c, "220 %s ESMTP testkit\r\n", name); err != nil {
		return
	}
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		verb, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		var reply string
		switch strings.ToUpper(verb) {
		case "HELO", "EHLO":
			reply = "250 " + name
		case "NOOP", "RSET":
			reply = "250 2.0.0 OK"
		case "QUIT":
			_, _ = fmt.Fprintf(c, "221 2.0.0 %s closing\r\n", name)
			return
		default:
			reply = "502 5.5.2 command not recognized"
		}
		if _, err := fmt.Fprintf(c, "%s\r\n", reply); err != nil {
			return
		}
	}
}
