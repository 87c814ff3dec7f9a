// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"time"
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
// are inside TLS records, which the driver decrypts itself: so the TLS to the pod is kept here
// instead (mysqlRelay, mysqltls.go), which checks the headers in plain text and passes them to
// the driver's TLS through an in-process one; the bytes of the pod's connection stay bounded by
// the limitedConn (maxProbeReadBytes in all). It also keeps the first error of a read or write:
// the driver reports most of them as "invalid connection".
type mysqlPacketConn struct {
	net.Conn
	realTLS *tls.Config                // the probe's TLS to the pod, after the driver's first write; nil: none
	relay   atomic.Pointer[mysqlRelay] // the TLS to the pod, once started (Close may run on another goroutine)
	buf     []byte                     // read from the socket, not yet returned
	cleared int                        // buf[:cleared] are checked and may be returned
	left    int                        // payload bytes of the current packet not yet cleared
	err     error                      // the first read or write error
}

// newMySQLPacketConn frames the packets of c; realTLS is the probe's TLS setup for the pod, nil
// without TLS (the driver's own TLS setup is then relayClientConfig's).
func newMySQLPacketConn(c net.Conn, realTLS *tls.Config) *mysqlPacketConn {
	return &mysqlPacketConn{Conn: c, realTLS: realTLS, buf: make([]byte, 0, mysqlReadBufferBytes)}
}

// Read returns checked bytes: whole headers within the bound, and payload.
func (c *mysqlPacketConn) Read(p []byte) (int, error) {
	if r := c.relay.Load(); r != nil && len(c.buf) == 0 {
		n, err := r.driverSide.Read(p)
		return n, c.keep(relayError(r, err))
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
// which the TLS to the pod is the relay's (started here, its handshake within the connection's
// deadlines) and the driver's TLS speaks to the relay.
func (c *mysqlPacketConn) Write(p []byte) (int, error) {
	if r := c.relay.Load(); r != nil {
		n, err := r.driverSide.Write(p)
		return n, c.keep(relayError(r, err))
	}
	n, err := c.Conn.Write(p)
	if err != nil || c.realTLS == nil {
		return n, c.keep(err)
	}
	r, err := startMySQLRelay(c.Conn, c.realTLS)
	if err != nil {
		return n, c.keep(err)
	}
	c.relay.Store(r)
	return n, nil
}

// SetDeadline sets the deadlines of the pod's connection and, once the relay runs, of the
// driver's pipe end too, so the driver's read and write timeouts hold under TLS as without.
func (c *mysqlPacketConn) SetDeadline(t time.Time) error {
	if r := c.relay.Load(); r != nil {
		_ = r.driverSide.SetDeadline(t)
	}
	return c.Conn.SetDeadline(t)
}

// SetReadDeadline is SetDeadline for reads.
func (c *mysqlPacketConn) SetReadDeadline(t time.Time) error {
	if r := c.relay.Load(); r != nil {
		_ = r.driverSide.SetReadDeadline(t)
	}
	return c.Conn.SetReadDeadline(t)
}

// SetWriteDeadline is SetDeadline for writes.
func (c *mysqlPacketConn) SetWriteDeadline(t time.Time) error {
	if r := c.relay.Load(); r != nil {
		_ = r.driverSide.SetWriteDeadline(t)
	}
	return c.Conn.SetWriteDeadline(t)
}

// Close closes the relay, if any, and the pod's connection.
func (c *mysqlPacketConn) Close() error {
	if r := c.relay.Load(); r != nil {
		r.close()
	}
	return c.Conn.Close()
}

// relayError is what a read or write of the driver's pipe end reports: the relay's own error
// when it ended (a packet over the bound, the pod's connection), else err.
func relayError(r *mysqlRelay, err error) error {
	if err == nil {
		return nil
	}
	if rerr := r.firstError(); rerr != nil {
		if errors.Is(rerr, io.EOF) {
			return io.EOF
		}
		return rerr
	}
	return err
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
	if c.err != nil {
		return c.err
	}
	// Under TLS the relay may have ended (a packet over the bound) without the driver's last
	// read or write reporting it here: the driver's TLS keeps the first error it met and
	// answers later calls from it, and the driver reports what it met as "invalid connection".
	if r := c.relay.Load(); r != nil {
		return r.firstError()
	}
	return nil
}
