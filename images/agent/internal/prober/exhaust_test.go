// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober_test

import (
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/prober"
	"github.com/deckhouse/service-with-healthchecks/testkit/pki"
)

// mysqlGreeting is a MySQL protocol 10 handshake packet (sequence 0) of a server that offers
// TLS (CLIENT_SSL) and mysql_native_password.
func mysqlGreeting() []byte {
	const (
		clientLongPassword  = 1
		clientConnectWithDB = 8
		clientProtocol41    = 0x200
		clientSSL           = 0x800
		clientTransactions  = 0x2000
		clientSecureConn    = 0x8000
		clientPluginAuth    = 1 << 19
	)
	caps := uint32(clientLongPassword | clientConnectWithDB | clientProtocol41 | clientSSL | clientTransactions | clientSecureConn | clientPluginAuth)
	p := []byte{10}
	p = append(p, "5.7.99-hostile"...)
	p = append(p, 0)
	p = binary.LittleEndian.AppendUint32(p, 1)
	p = append(p, "abcdefgh"...)
	p = append(p, 0)
	p = binary.LittleEndian.AppendUint16(p, uint16(caps))
	p = append(p, 0x21)
	p = binary.LittleEndian.AppendUint16(p, 2)
	p = binary.LittleEndian.AppendUint16(p, uint16(caps>>16))
	p = append(p, 21)
	p = append(p, make([]byte, 10)...)
	p = append(p, "ijklmnopqrst"...)
	p = append(p, 0)
	p = append(p, "mysql_native_password"...)
	p = append(p, 0)
	return append([]byte{byte(len(p)), byte(len(p) >> 8), byte(len(p) >> 16), 0}, p...)
}

// readMySQLPacket reads one packet of the client.
func readMySQLPacket(r io.Reader) error {
	h := make([]byte, 4)
	if _, err := io.ReadFull(r, h); err != nil {
		return err
	}
	_, err := io.ReadFull(r, make([]byte, int(h[0])|int(h[1])<<8|int(h[2])<<16))
	return err
}

// hostileMySQLTLS is a MySQL server that offers TLS, takes the probe's SSL request and TLS
// handshake, reads its handshake response inside TLS, and then answers with a packet header
// that declares 2^24-1 bytes (a packet the driver would allocate whole) and garbage without end.
func hostileMySQLTLS(cfg *tls.Config) hostileScript {
	return func(c *countingConn) error {
		if _, err := c.Write(mysqlGreeting()); err != nil {
			return err
		}
		if err := readMySQLPacket(c); err != nil { // The SSL request.
			return err
		}
		t := tls.Server(c, cfg)
		if err := t.Handshake(); err != nil {
			return err
		}
		if err := readMySQLPacket(t); err != nil { // The handshake response, inside TLS.
			return err
		}
		if _, err := t.Write([]byte{0xff, 0xff, 0xff, 2}); err != nil {
			return err
		}
		chunk := garbage(4 << 10)
		for c.written < hostileMaxBytes {
			if _, err := t.Write(chunk); err != nil {
				return err
			}
		}
		return nil
	}
}

// TestExhaustManyMySQLProbesOfHostileServersCostAConstantEach runs many MySQL probes at once,
// with TLS and without, against servers that declare a 16 MiB packet (the driver would allocate
// it whole before reading it) and send garbage without end. Each probe fails naming the
// prober's packet bound; the Go heap the whole run allocates (prober and servers, the collector
// off so nothing is returned meanwhile) is a small constant per probe, far below the 16 MiB each
// probe cost when the driver read the packets of a TLS connection itself. The peak of the live
// heap is logged. Positive control: the same prober, in the same run, passes a probe of a real
// MySQL TLS handshake that answers OK (the relay's TLS carries the driver's honest exchange).
func TestExhaustManyMySQLProbesOfHostileServersCostAConstantEach(t *testing.T) {
	ca, err := pki.NewCA("hostile-mysql-ca")
	require.NoError(t, err)
	pair, err := ca.Server("hostile-mysql", nil, []net.IP{net.ParseIP("127.0.0.1")})
	require.NoError(t, err)
	cert, err := pair.TLSCertificate()
	require.NoError(t, err)
	serverTLS := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}

	const probes = 48 // per server kind
	tests := map[string]struct {
		script hostileScript
		creds  staticCredentials
		secret string
	}{
		"with TLS": {
			script: hostileMySQLTLS(serverTLS),
			creds:  staticCredentials{"db": mySecret(map[string]string{"user": "app", "password": myAppPassword, "tlsMode": "SkipVerification"})},
			secret: "db",
		},
		"without TLS": {
			script: func(c *countingConn) error {
				if _, err := c.Write([]byte{0xff, 0xff, 0xff, 0}); err != nil {
					return err
				}
				return stream(c, garbage(4<<10))
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			inNamedNetns(t, "", hostileSysctls, func(netns string) {
				h, err := startHostile(tc.script)
				require.NoError(t, err)
				defer h.close()
				p := prober.New(prober.Options{Credentials: tc.creds})
				probe := myProbe("", "", tc.secret, 5)

				runtime.GC()
				defer debug.SetGCPercent(debug.SetGCPercent(-1))
				var before runtime.MemStats
				runtime.ReadMemStats(&before)
				var peak atomic.Uint64
				stop := make(chan struct{})
				sampled := make(chan struct{})
				go func() {
					defer close(sampled)
					var m runtime.MemStats
					for {
						select {
						case <-stop:
							return
						case <-time.After(5 * time.Millisecond): // A sampling pace, not a synchronisation.
						}
						runtime.ReadMemStats(&m)
						if m.HeapAlloc > peak.Load() {
							peak.Store(m.HeapAlloc)
						}
					}
				}()

				var wg sync.WaitGroup
				results := make([]prober.Result, probes)
				for i := range probes {
					wg.Go(func() {
						// Each probe dials from a thread of the test's network namespace.
						if !assert.NoError(t, enterNetns(netns)) {
							return
						}
						res, err := p.Probe(t.Context(), probe, "ns", "127.0.0.1", h.port())
						assert.NoError(t, err)
						results[i] = res
					})
				}
				wg.Wait()
				close(stop)
				<-sampled
				var after runtime.MemStats
				runtime.ReadMemStats(&after)

				for _, res := range results {
					assert.Equal(t, prober.Result{Outcome: prober.Failure, Reason: "server sent a MySQL packet of more than 64 KiB (the prober's limit per MySQL packet)"}, res)
				}
				allocated := after.TotalAlloc - before.TotalAlloc
				perProbe := allocated / probes
				t.Logf("%d probes at once: %d KiB allocated in all (prober and servers), %d KiB per probe; live heap peak %d KiB above the start",
					probes, allocated>>10, perProbe>>10, (max(peak.Load(), before.HeapAlloc)-before.HeapAlloc)>>10)
				// The driver's 16 MiB packet, allocated per probe, would be 16384 KiB per probe.
				assert.Less(t, perProbe, uint64(1<<20), "each probe costs less than 1 MiB of heap, whatever the server declares")
			})
		})
	}
}

// enterNetns locks the calling goroutine to its thread and moves the thread into the network
// namespace name; the thread is not unlocked, so it leaves with the goroutine.
func enterNetns(name string) error {
	runtime.LockOSThread()
	f, err := os.Open("/run/netns/" + name)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("entering netns %s: %w", name, err)
	}
	return nil
}
