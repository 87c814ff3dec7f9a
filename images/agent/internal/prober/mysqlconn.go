// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"net"
)

// mysqlHeaderBytes is the size of a MySQL packet header: a 24-bit payload length and a
// sequence number.
const mysqlHeaderBytes = 4

// mysqlReadBufferBytes is what mysqlPacketConn reads from the socket at once.
const mysqlReadBufferBytes = 4 << 10

// errMySQLPacketTooLarge is the error once a server declares a packet over the bound.
var errMySQLPacketTooLarge = &readLimitError{
	"server sent a MySQL packet of more than " + byteSize(maxMySQLPacketBytes) + " (the prober's limit per MySQL packet)",
}

// mysqlPacketConn sits between the MySQL driver and the pod's connection (a limitedConn). The
// driver allocates the length a packet header declares before reading the packet (up to
// 16 MiB, and more for a packet split in several): so the header of every packet is read here
// first, and one that declares more than maxMySQLPacketBytes fails the probe before the driver
// sees it. Once the driver starts TLS (its first write is then the SSL request), the packets
// are inside TLS records: from there on the bytes pass through unread, bounded by the
// limitedConn (maxProbeReadBytes in all) and crypto/tls (one record at a time). It also keeps
// the first error of a read or write: the driver reports most of them as "invalid connection".
type mysqlPacketConn struct {
	net.Conn
	startsTLS bool   // the driver starts TLS after its first write
	passed    bool   // TLS started: no framing any more
	buf       []byte // read from the socket, not yet returned
	cleared   int    // buf[:cleared] are checked and may be returned
	left      int    // payload bytes of the current packet not yet cleared
	err       error  // the first read or write error
}

func newMySQLPacketConn(c net.Conn, startsTLS bool) *mysqlPacketConn {
	return &mysqlPacketConn{Conn: c, startsTLS: startsTLS, buf: make([]byte, 0, mysqlReadBufferBytes)}
}

// Read returns checked bytes: whole headers within the bound, and payload.
func (c *mysqlPacketConn) Read(p []byte) (int, error) {
	if c.passed && len(c.buf) == 0 {
		n, err := c.Conn.Read(p)
		return n, c.keep(err)
	}
	c.clear()
	for c.cleared == 0 {
		if c.err != nil {
			return 0, c.err
		}
		if len(c.buf) == cap(c.buf) {
			// Only an incomplete header can be held back, and it is shorter than the buffer.
			return 0, c.keep(errMySQLPacketTooLarge)
		}
		n, err := c.Conn.Read(c.buf[len(c.buf):cap(c.buf)])
		c.buf = c.buf[:len(c.buf)+n]
		c.clear()
		if c.cleared == 0 && err != nil {
			return 0, c.keep(err)
		}
	}
	n := copy(p, c.buf[:c.cleared])
	c.cleared -= n
	c.buf = c.buf[:copy(c.buf, c.buf[n:])]
	return n, nil
}

// clear checks the headers in buf past cleared; a packet over the bound sets err and stops
// clearing at its header. After TLS started every byte is cleared as it is.
func (c *mysqlPacketConn) clear() {
	for c.cleared < len(c.buf) && c.err == nil {
		rest := len(c.buf) - c.cleared
		switch {
		case c.passed:
			c.cleared = len(c.buf)
		case c.left > 0:
			k := min(c.left, rest)
			c.cleared += k
			c.left -= k
		case rest < mysqlHeaderBytes:
			return
		default:
			h := c.buf[c.cleared:]
			length := int(h[0]) | int(h[1])<<8 | int(h[2])<<16
			if length > maxMySQLPacketBytes {
				c.err = errMySQLPacketTooLarge
				return
			}
			c.cleared += mysqlHeaderBytes
			c.left = length
		}
	}
}

// Write writes p; the first write of a connection that starts TLS is the SSL request, after
// which the stream is TLS.
func (c *mysqlPacketConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if c.startsTLS {
		c.passed = true
	}
	return n, c.keep(err)
}

// keep remembers the first error and returns err.
func (c *mysqlPacketConn) keep(err error) error {
	if err != nil && c.err == nil {
		c.err = err
	}
	return err
}

// firstError is the first error a read or write met, if any.
func (c *mysqlPacketConn) firstError() error {
	return c.err
}
