// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober_test

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/prober"
	"github.com/deckhouse/service-with-healthchecks/testkit/pki"
)

// Hostile servers: each answers a probe the way a pod that wants the agent's memory would,
// counting the bytes it managed to write. They run in tests (in a network namespace with small
// socket buffers, so what the server wrote is close to what the prober read) and, as separate
// processes, in BenchmarkHostile (so the benchmark counts only the prober's allocations).

// The prober's bounds, as the tests expect them (see limits.go and development/PROBES.md).
const (
	headerBound    = 64 << 10
	tlsBound       = 64 << 10
	pgMessageBound = 64 << 10
	// mysqlPacketBound is what the prober reads of a MySQL server before a packet header: the
	// bound refuses the header itself, so only the first read (4 KiB) comes in.
	mysqlPacketBound = 4 << 10
	probeReadBound   = 1 << 20
	hostileMaxBytes  = 64 << 20 // A hostile server writes at most this much per connection.
	// hostileSlack is what the kernel holds between the two ends: the server's send buffer
	// and the prober's receive buffer, both 16 KiB in hostileSysctls, with room to spare.
	hostileSlack = 64 << 10
)

// hostileSysctls shrink the socket buffers of the test's network namespace, so that what a
// hostile server counts as written exceeds what the prober read by at most hostileSlack.
var hostileSysctls = map[string]string{
	"net.ipv4.tcp_rmem": "4096 16384 16384",
	"net.ipv4.tcp_wmem": "4096 16384 16384",
}

// countingConn counts what the server wrote to the prober, on this connection and in total.
type countingConn struct {
	net.Conn
	written int64
	total   *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written += int64(n)
	c.total.Add(int64(n))
	return n, err
}

// A hostileScript serves one connection. Its error is the one that ended its writes (the
// prober hung up); nil means it ran out of things to send.
type hostileScript func(c *countingConn) error

// hostileCase is one hostile server and what the prober must make of it.
type hostileCase struct {
	script hostileScript
	probe  func() v1alpha1.Probe
	reason string
	bound  int64 // what the prober may read of it, before hostileSlack
}

func hostileHTTPProbe() v1alpha1.Probe { return httpProbe(v1alpha1.HTTPProbe{}) }

func hostileHTTPSProbe() v1alpha1.Probe {
	return httpProbe(v1alpha1.HTTPProbe{Scheme: corev1.URISchemeHTTPS, InsecureSkipTLSVerify: true})
}

func hostilePGProbe() v1alpha1.Probe { return pgProbe("", "", "", 1) }

func hostileMySQLProbe() v1alpha1.Probe { return myProbe("", "", "", 1) }

func hostileGRPCProbe() v1alpha1.Probe { return grpcProbe(v1alpha1.GRPCProbe{}) }

// grpcBufferBound is what a gRPC probe reads before it judges a server preface: its 4 KiB
// read buffer, with room to spare.
const grpcBufferBound = 16 << 10

// drain reads and drops what the prober sends, so that its writes (the HTTP/2 preface, PING
// acknowledgements) never wait for the server.
func drain(c net.Conn) { _, _ = io.Copy(io.Discard, c) }

// http2Frame is an HTTP/2 frame of type typ on stream 0 with payload.
func http2Frame(typ byte, payload []byte) []byte {
	f := []byte{byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload)), typ, 0, 0, 0, 0, 0}
	return append(f, payload...)
}

// hostileCases are keyed by a name that is also the argument of the server process.
func hostileCases() map[string]hostileCase {
	return map[string]hostileCase{
		"an HTTP header line that never ends": {
			script: func(c *countingConn) error {
				readHTTPRequest(c)
				if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nX-A: "); err != nil {
					return err
				}
				return stream(c, bytes.Repeat([]byte("a"), 4<<10))
			},
			probe:  hostileHTTPProbe,
			reason: "response status line and headers exceed 64 KiB (the prober's limit)",
			bound:  headerBound,
		},
		"100 000 HTTP headers": {
			script: func(c *countingConn) error {
				readHTTPRequest(c)
				var b bytes.Buffer
				b.WriteString("HTTP/1.1 200 OK\r\n")
				for i := range 100_000 {
					fmt.Fprintf(&b, "X-H%d: v\r\n", i)
				}
				b.WriteString("Content-Length: 0\r\n\r\n")
				_, err := c.Write(b.Bytes())
				return err
			},
			probe:  hostileHTTPProbe,
			reason: "response status line and headers exceed 64 KiB (the prober's limit)",
			bound:  headerBound,
		},
		"an HTTP response that comes one byte every 100 ms": {
			script: func(c *countingConn) error {
				readHTTPRequest(c)
				head := []byte("HTTP/1.1 200 OK\r\nX-Slow: " + string(bytes.Repeat([]byte("s"), 200)))
				for _, b := range head {
					if _, err := c.Write([]byte{b}); err != nil {
						return err
					}
					time.Sleep(100 * time.Millisecond) // The pace of the attack, not a synchronisation.
				}
				return nil
			},
			probe:  hostileHTTPProbe,
			reason: "reading response: timeout after 1s",
			bound:  headerBound,
		},
		"a PostgreSQL message that claims a gigabyte": {
			script: func(c *countingConn) error {
				readPGStartup(c)
				msg := []byte{'R', 0, 0, 0, 0}
				binary.BigEndian.PutUint32(msg[1:], 1_000_000_000+4)
				if _, err := c.Write(msg); err != nil {
					return err
				}
				return stream(c, bytes.Repeat([]byte{0}, 4<<10))
			},
			probe:  hostilePGProbe,
			reason: "server sent a message of 1000000000 bytes, over 64 KiB (the prober's limit per PostgreSQL message)",
			// The reason shows the message bound refused the header (no gigabyte is allocated).
			// What was read before the header was examined depends on timing (pgconn reads
			// ahead in chunks, its background reader too while it runs) and is bounded by the
			// probe's bound: under -race, after a loaded run, the server wrote 540 KB.
			bound: probeReadBound,
		},
		"a PostgreSQL server that sends notices without end": {
			script: func(c *countingConn) error {
				readPGStartup(c)
				return stream(c, bytes.Repeat(pgNotice("ping"), 256))
			},
			probe:  hostilePGProbe,
			reason: "server sent more than 1 MiB (the prober's limit per probe)",
			bound:  probeReadBound,
		},
		"a MySQL handshake packet that claims 16 MiB": {
			script: func(c *countingConn) error {
				// The server speaks first: a header of 2^24-1 bytes (a packet the driver would
				// allocate whole, then continue), then bytes without end.
				if _, err := c.Write([]byte{0xff, 0xff, 0xff, 0}); err != nil {
					return err
				}
				return stream(c, garbage(4<<10))
			},
			probe:  hostileMySQLProbe,
			reason: "server sent a MySQL packet of more than 64 KiB (the prober's limit per MySQL packet)",
			bound:  mysqlPacketBound,
		},
		"a MySQL handshake that comes one byte every 100 ms": {
			script: func(c *countingConn) error {
				if _, err := c.Write([]byte{200, 0, 0, 0}); err != nil {
					return err
				}
				for range 200 {
					if _, err := c.Write([]byte{10}); err != nil {
						return err
					}
					time.Sleep(100 * time.Millisecond) // The pace of the attack, not a synchronisation.
				}
				return nil
			},
			probe:  hostileMySQLProbe,
			reason: "timeout after 1s",
			bound:  mysqlPacketBound,
		},
		"a MySQL server that never answers": {
			script: func(c *countingConn) error {
				// Waits for the prober to hang up; it never sends its handshake.
				_, err := c.Read(make([]byte, 1))
				if err == nil {
					err = io.ErrUnexpectedEOF
				}
				return err
			},
			probe:  hostileMySQLProbe,
			reason: "timeout after 1s",
			bound:  0,
		},
		"a TLS peer that streams garbage": {
			script: func(c *countingConn) error {
				readOnce(c) // The ClientHello.
				return stream(c, garbage(16<<10))
			},
			probe:  hostileHTTPSProbe,
			reason: "TLS: server did not answer with TLS",
			bound:  tlsBound,
		},
		"a TLS peer that streams garbage behind an oversized record header": {
			script: func(c *countingConn) error {
				readOnce(c)
				if _, err := c.Write([]byte{22, 3, 3, 0xff, 0xff}); err != nil {
					return err
				}
				return stream(c, garbage(16<<10))
			},
			probe:  hostileHTTPSProbe,
			reason: "TLS: oversized record received with length 65535 (over crypto/tls's record limit)",
			bound:  tlsBound,
		},
		"a TLS peer that streams a handshake message claiming 16 MiB": {
			script: func(c *countingConn) error {
				readOnce(c)
				// Full-size handshake records; the first starts a ServerHello of 2^24-1 bytes.
				record := append([]byte{22, 3, 3, 0x40, 0x00}, garbage(16<<10)...)
				first := bytes.Clone(record)
				copy(first[5:], []byte{2, 0xff, 0xff, 0xff})
				if _, err := c.Write(first); err != nil {
					return err
				}
				return stream(c, record)
			},
			probe:  hostileHTTPSProbe,
			reason: "TLS: handshake message of length 16777215 bytes exceeds maximum of 65536 bytes",
			bound:  tlsBound,
		},
		"endless bytes to a gRPC probe": {
			script: func(c *countingConn) error {
				go drain(c)
				return stream(c, garbage(16<<10))
			},
			probe:  hostileGRPCProbe,
			reason: `gRPC Unavailable: connection error: desc = "error reading server preface: http2: frame too large"`,
			bound:  grpcBufferBound,
		},
		"endless HTTP/2 PING frames to a gRPC probe": {
			script: func(c *countingConn) error {
				go drain(c)
				if _, err := c.Write(http2Frame(4, nil)); err != nil { // SETTINGS, empty
					return err
				}
				return stream(c, bytes.Repeat(http2Frame(6, make([]byte, 8)), 1<<10))
			},
			probe:  hostileGRPCProbe,
			reason: "server sent more than 1 MiB (the prober's limit per probe)",
			bound:  probeReadBound,
		},
		"a real TLS server whose certificate chain carries 200 KiB, to a gRPC probe": {
			script: func(c *countingConn) error {
				return tls.Server(c, bigChainConfig()).Handshake()
			},
			probe:  func() v1alpha1.Probe { return grpcProbe(v1alpha1.GRPCProbe{TLS: true, InsecureSkipTLSVerify: true}) },
			reason: "TLS: handshake exceeds 64 KiB (the prober's limit)",
			bound:  tlsBound,
		},
		"a real TLS server whose certificate chain carries 200 KiB": {
			script: func(c *countingConn) error {
				return tls.Server(c, bigChainConfig()).Handshake()
			},
			probe:  hostileHTTPSProbe,
			reason: "TLS: handshake exceeds 64 KiB (the prober's limit)",
			bound:  tlsBound,
		},
	}
}

// stream writes chunk again and again until a write fails (the prober hung up) or
// hostileMaxBytes are written.
func stream(c *countingConn, chunk []byte) error {
	for c.written < hostileMaxBytes {
		if _, err := c.Write(chunk); err != nil {
			return err
		}
	}
	return nil
}

// readHTTPRequest reads up to the end of the request's head (the probe sends no body) and
// returns what it read.
func readHTTPRequest(c net.Conn) []byte {
	var got []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(got, []byte("\r\n\r\n")) && len(got) < 64<<10 {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			break
		}
	}
	return got
}

// readPGStartup reads the startup message (its length, then the rest).
func readPGStartup(c net.Conn) {
	var n [4]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return
	}
	_, _ = io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(n[:]))-4)
}

func readOnce(c net.Conn) {
	_, _ = c.Read(make([]byte, 16<<10))
}

// pgNotice is a NoticeResponse message.
func pgNotice(text string) []byte {
	body := []byte("SNOTICE\x00C00000\x00M" + text + "\x00\x00")
	msg := []byte{'N', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(msg[1:], uint32(len(body)+4))
	return append(msg, body...)
}

// garbage is n pseudo-random bytes that start with a byte no TLS record starts with.
func garbage(n int) []byte {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	b[0] = 'G'
	return b
}

// bigChainConfig is a server whose Certificate message carries a 200 KiB blob after the leaf
// (crypto/tls sends chain entries as they are, and accepts up to 256 KiB from a server).
var bigChainConfig = sync.OnceValue(func() *tls.Config {
	ca, err := pki.NewCA("hostile-ca")
	if err != nil {
		panic(err)
	}
	pair, err := ca.Server("hostile", nil, []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		panic(err)
	}
	cert, err := pair.TLSCertificate()
	if err != nil {
		panic(err)
	}
	cert.Certificate = append(cert.Certificate, garbage(200<<10))
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
})

// hostileServer serves a script on every connection until closed.
type hostileServer struct {
	l       net.Listener
	written atomic.Int64
	wg      sync.WaitGroup
	mu      sync.Mutex
	ended   []error
}

// startHostile listens on loopback (in the current network namespace) and serves script.
func startHostile(script hostileScript) (*hostileServer, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &hostileServer{l: l}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			h.wg.Add(1)
			go func() {
				defer h.wg.Done()
				defer c.Close()
				// A small send buffer, so what the server counts as written is close to what the
				// prober took; a deadline, so no script outlives its test.
				_ = c.(*net.TCPConn).SetWriteBuffer(16 << 10)
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				err := script(&countingConn{Conn: c, total: &h.written})
				h.mu.Lock()
				h.ended = append(h.ended, err)
				h.mu.Unlock()
			}()
		}
	}()
	return h, nil
}

func (h *hostileServer) port() int32 { return port(h.l) }

// close stops the server and waits for its connections.
func (h *hostileServer) close() {
	_ = h.l.Close()
	h.wg.Wait()
}

// endings are the errors that ended the served connections' scripts.
func (h *hostileServer) endings() []error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]error(nil), h.ended...)
}

func TestHostileServersHitABoundAndTheProbeEndsByItsDeadline(t *testing.T) {
	for name, tc := range hostileCases() {
		t.Run(name, func(t *testing.T) {
			inNetnsWith(t, "", hostileSysctls, func() {
				h, err := startHostile(tc.script)
				if !assert.NoError(t, err) {
					return
				}
				probe := tc.probe()
				start := time.Now()
				res, err := newProber(prober.Options{}).Probe(t.Context(), probe, "ns", "127.0.0.1", h.port())
				elapsed := time.Since(start)
				h.close()

				assert.NoError(t, err)
				assert.Equal(t, prober.Result{Outcome: prober.Failure, Reason: tc.reason}, res)
				assert.Less(t, elapsed, deadlineBound(probe.TimeoutSeconds), "the probe ends by its deadline")
				written := h.written.Load()
				t.Logf("the server wrote %d bytes in %v: %s", written, elapsed, res.Reason)
				assert.LessOrEqual(t, written, tc.bound+hostileSlack,
					"the server wrote %d bytes; the prober may read %d plus the kernel's buffers", written, tc.bound)
				// The server had more to send when the prober hung up: the bound, not the end of
				// the script, is what stopped the reading.
				endings := h.endings()
				if assert.Len(t, endings, 1, "one connection") {
					assert.Error(t, endings[0], "the prober hung up while the server was still sending")
				}
			})
		})
	}
}

// TestHostileHTTPHeadersWithinTheBoundStillPass is the control of the header bound: a
// response whose head is large but within it is judged by its status code as before.
func TestHostileHTTPHeadersWithinTheBoundStillPass(t *testing.T) {
	var head bytes.Buffer
	head.WriteString("HTTP/1.1 204 No Content\r\n")
	for i := 0; head.Len() < headerBound-4<<10; i++ {
		head.WriteString("X-Padding-" + strconv.Itoa(i) + ": " + string(bytes.Repeat([]byte("p"), 100)) + "\r\n")
	}
	head.WriteString("\r\n")
	h, err := startHostile(func(c *countingConn) error {
		readHTTPRequest(c)
		_, err := c.Write(head.Bytes())
		return err
	})
	require.NoError(t, err)
	defer h.close()
	res, err := newProber(prober.Options{}).Probe(t.Context(), hostileHTTPProbe(), "ns", "127.0.0.1", h.port())
	require.NoError(t, err)
	require.Equal(t, prober.Result{Outcome: prober.Success, Reason: "HTTP 204"}, res)
	require.Greater(t, head.Len(), headerBound/2, "the head is large")
}
