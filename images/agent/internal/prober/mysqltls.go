// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"sync"
	"time"
)

// The MySQL driver allocates the length a packet header declares (up to 16 MiB) before it reads
// the packet, and once it starts TLS it reads the packets from its own tls.Conn: below it,
// mysqlPacketConn sees only TLS records and cannot check a header. So the probe keeps TLS
// itself (issue 40): after the driver's SSL request, mysqlRelay speaks TLS to the pod with the
// probe's real TLS setup (credentialsTLSConfig: the same verification, the same errors), reads
// the server's packets in plain text and checks every header against maxMySQLPacketBytes, and
// hands the checked bytes to the driver through an in-process TLS connection (net.Pipe) whose
// server is the relay, with a key made once per process that only the driver's TLS setup
// (relayClientConfig) trusts. The driver still runs TLS and still decides as with TLS (a clear-
// text password only where the probe's setup verifies the server: AllowCleartextPasswords), and
// a hostile server costs a constant per probe whether it speaks TLS or not.

// relayServerName is the name of the relay's certificate; it names nothing outside the process.
const relayServerName = "mysql-relay.service-with-healthchecks.invalid"

var (
	relayOnce   sync.Once
	relayServer *tls.Config
	relayClient *tls.Config
	errRelay    error
)

// relayConfigs makes the relay's key and certificate once, and the TLS setups of the relay's
// server and of the driver, which trusts that certificate only.
func relayConfigs() (server, client *tls.Config, err error) {
	relayOnce.Do(func() {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			errRelay = fmt.Errorf("MySQL TLS relay key: %w", err)
			return
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(1),
			Subject:      pkix.Name{CommonName: relayServerName},
			DNSNames:     []string{relayServerName},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(100 * 365 * 24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			errRelay = fmt.Errorf("MySQL TLS relay certificate: %w", err)
			return
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			errRelay = fmt.Errorf("MySQL TLS relay certificate: %w", err)
			return
		}
		pool := x509.NewCertPool()
		pool.AddCert(cert)
		relayServer = &tls.Config{
			Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}},
			MinVersion:   tls.VersionTLS13,
		}
		relayClient = &tls.Config{RootCAs: pool, ServerName: relayServerName, MinVersion: tls.VersionTLS13}
	})
	return relayServer, relayClient, errRelay
}

// mysqlFramer checks the headers of a stream of MySQL packets as its bytes pass: a header that
// declares more than maxMySQLPacketBytes is an error before the chunk that completes it is let
// through, so no reader above ever sees it whole.
type mysqlFramer struct {
	left int                    // payload bytes of the current packet still to come
	hdr  [mysqlHeaderBytes]byte // the header being read
	hn   int                    // bytes of hdr read
}

// check passes b through the framer.
func (f *mysqlFramer) check(b []byte) error {
	for len(b) > 0 {
		if f.left > 0 {
			k := min(f.left, len(b))
			f.left -= k
			b = b[k:]
			continue
		}
		k := copy(f.hdr[f.hn:], b)
		f.hn += k
		b = b[k:]
		if f.hn < mysqlHeaderBytes {
			return nil
		}
		f.hn = 0
		length := int(f.hdr[0]) | int(f.hdr[1])<<8 | int(f.hdr[2])<<16
		if length > maxMySQLPacketBytes {
			return errMySQLPacketTooLarge
		}
		f.left = length
	}
	return nil
}

// mysqlRelay is the TLS between the probe and the pod, and the in-process TLS the driver
// speaks: see the comment at the top of this file.
type mysqlRelay struct {
	driverSide net.Conn  // the pipe end the driver's tls.Conn reads and writes
	inner      *tls.Conn // the relay's TLS server on the other pipe end
	outer      *tls.Conn // TLS to the pod

	mu  sync.Mutex
	err error // the first error of the relay: a packet over the bound, the pod's connection
}

// startMySQLRelay speaks TLS to the pod over raw with cfg (the handshake happens here, within
// raw's deadlines) and starts the relay.
func startMySQLRelay(raw net.Conn, cfg *tls.Config) (*mysqlRelay, error) {
	serverCfg, _, err := relayConfigs()
	if err != nil {
		return nil, err
	}
	outer := tls.Client(raw, cfg)
	if err := outer.Handshake(); err != nil {
		return nil, err
	}
	driverSide, relaySide := net.Pipe()
	r := &mysqlRelay{driverSide: driverSide, inner: tls.Server(relaySide, serverCfg), outer: outer}
	go r.toPod()
	go r.toDriver()
	return r, nil
}

// toPod passes what the driver writes (its packets, at most MaxAllowedPacket each) to the pod.
func (r *mysqlRelay) toPod() {
	buf := make([]byte, mysqlReadBufferBytes)
	for {
		n, err := r.inner.Read(buf)
		if n > 0 {
			if _, werr := r.outer.Write(buf[:n]); werr != nil {
				r.fail(werr)
				return
			}
		}
		if err != nil {
			r.fail(err)
			return
		}
	}
}

// toDriver passes the pod's packets to the driver, every header checked first.
func (r *mysqlRelay) toDriver() {
	buf := make([]byte, mysqlReadBufferBytes)
	var f mysqlFramer
	for {
		n, err := r.outer.Read(buf)
		if n > 0 {
			if ferr := f.check(buf[:n]); ferr != nil {
				r.fail(ferr)
				return
			}
			if _, werr := r.inner.Write(buf[:n]); werr != nil {
				r.fail(werr)
				return
			}
		}
		if err != nil {
			r.fail(err)
			return
		}
	}
}

// fail records the relay's first error and closes everything, which ends both directions and
// the driver's reads.
func (r *mysqlRelay) fail(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
	r.close()
}

// firstError is the relay's first error, nil while it runs.
func (r *mysqlRelay) firstError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// close closes the pipe ends and the pod's connection; it may be called more than once.
func (r *mysqlRelay) close() {
	_ = r.driverSide.Close()
	_ = r.inner.NetConn().Close()
	_ = r.outer.NetConn().Close()
}
