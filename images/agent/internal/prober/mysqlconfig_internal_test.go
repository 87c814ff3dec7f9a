// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"bytes"
	"crypto/tls"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/credentials"
	"github.com/deckhouse/service-with-healthchecks/testkit/pki"
)

func TestMySQLVerdict(t *testing.T) {
	pass := success("query returned a true value")
	cases := map[string]struct {
		gotRow bool
		value  driver.Value
		want   Result
	}{
		"no row":                {false, nil, failure("query returned no rows")},
		"NULL":                  {true, nil, failure("query returned NULL")},
		"1":                     {true, int64(1), pass},
		"-1":                    {true, int64(-1), pass},
		"0":                     {true, int64(0), failure("query returned false (0)")},
		"unsigned max":          {true, uint64(1<<64 - 1), pass},
		"unsigned 0":            {true, uint64(0), failure("query returned false (0)")},
		"float 0.5":             {true, float64(0.5), pass},
		"float 0":               {true, float64(0), failure("query returned false (0)")},
		"float32 0":             {true, float32(0), failure("query returned false (0)")},
		"decimal text 0.00":     {true, []byte("0.00"), failure("query returned false (0.00)")},
		"decimal text -0.001":   {true, []byte("-0.001"), pass},
		"decimal text 1":        {true, []byte("1"), pass},
		"text 0":                {true, []byte("0"), failure("query returned false (0)")},
		"text true":             {true, []byte("TRUE"), pass},
		"text false":            {true, []byte("false"), failure("query returned false")},
		"text yes":              {true, []byte("yes"), failure(`query returned "yes", not a number or true`)},
		"empty text":            {true, []byte(""), failure(`query returned "", not a number or true`)},
		"a date is not true":    {true, []byte("2026-01-01"), failure(`query returned "2026-01-01", not a number or true`)},
		"control characters":    {true, []byte("a\nb"), failure(`query returned "a b", not a number or true`)},
		"a long text is cut":    {true, bytes.Repeat([]byte("x"), 100), failure(`query returned "` + string(bytes.Repeat([]byte("x"), 37)) + `…", not a number or true`)},
		"an unexpected type":    {true, time.Time{}, failure("query returned a value of an unexpected type")},
		"a string value counts": {true, "1", pass},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, mysqlVerdict(tc.gotRow, tc.value))
		})
	}
}

func TestDecimalZero(t *testing.T) {
	cases := map[string]struct{ zero, ok bool }{
		"0": {true, true}, "00": {true, true}, "-0": {true, true}, "+0.0": {true, true}, ".0": {true, true}, "0.": {true, true},
		"1": {false, true}, "0.01": {false, true}, "-12.5": {false, true}, "123456789012345678901234567890": {false, true},
		"": {false, false}, ".": {false, false}, "-": {false, false}, "1e3": {false, false}, "0x1": {false, false},
		"1.2.3": {false, false}, "inf": {false, false}, " 1": {false, false},
	}
	for text, want := range cases {
		zero, ok := decimalZero(text)
		assert.Equal(t, want, struct{ zero, ok bool }{zero, ok}, "%q", text)
	}
}

func TestMySQLConfig(t *testing.T) {
	ca, err := pki.NewCA("cfg-ca")
	require.NoError(t, err)
	addr := netip.MustParseAddrPort("10.0.0.7:3306")
	cases := map[string]struct {
		creds         *credentials.Credentials
		user          string
		tls           bool
		skipVerify    bool
		serverName    string
		allowCleartxt bool
	}{
		"no Secret: root, no TLS": {creds: nil, user: "root"},
		"Disabled":                {creds: &credentials.Credentials{User: "app", TLSMode: credentials.TLSDisabled}, user: "app"},
		"SkipVerification":        {creds: &credentials.Credentials{User: "app", TLSMode: credentials.TLSSkipVerification}, user: "app", tls: true, skipVerify: true},
		"VerifyCA checks the chain only": {
			creds: &credentials.Credentials{User: "app", TLSMode: credentials.TLSVerifyCA, RootCAs: ca.Pool}, user: "app", tls: true, skipVerify: true,
		},
		"VerifyAll checks the pod IP and may send a clear-text password": {
			creds: &credentials.Credentials{User: "app", TLSMode: credentials.TLSVerifyAll, RootCAs: ca.Pool}, user: "app", tls: true,
			serverName: "10.0.0.7", allowCleartxt: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := mysqlConfig(addr, "appdb", tc.creds, 3*time.Second, nil)
			assert.Equal(t, tc.user, cfg.User)
			assert.Equal(t, "10.0.0.7:3306", cfg.Addr)
			assert.Equal(t, "appdb", cfg.DBName)
			assert.Equal(t, 3*time.Second, cfg.Timeout)
			assert.Equal(t, 3*time.Second, cfg.ReadTimeout)
			assert.Equal(t, 3*time.Second, cfg.WriteTimeout)
			assert.Equal(t, maxMySQLPacketBytes, cfg.MaxAllowedPacket)
			assert.False(t, cfg.AllowAllFiles, "no LOAD DATA LOCAL INFILE")
			assert.False(t, cfg.MultiStatements)
			assert.False(t, cfg.InterpolateParams)
			assert.False(t, cfg.AllowOldPasswords)
			assert.False(t, cfg.AllowFallbackToPlaintext)
			assert.Equal(t, tc.allowCleartxt, cfg.AllowCleartextPasswords)
			require.Equal(t, tc.tls, cfg.TLS != nil)
			if cfg.TLS != nil {
				assert.Equal(t, tc.skipVerify, cfg.TLS.InsecureSkipVerify)
				assert.Equal(t, tc.serverName, cfg.TLS.ServerName)
				assert.Equal(t, uint16(tls.VersionTLS12), cfg.TLS.MinVersion)
			}
			_, err := mysql.NewConnector(cfg)
			assert.NoError(t, err)
		})
	}
}

func TestMySQLQueryDefault(t *testing.T) {
	assert.Equal(t, "SELECT 1", mysqlQuery(""))
	assert.Equal(t, "SELECT 1", mysqlQuery("  "))
	assert.Equal(t, "SELECT @@read_only = 0", mysqlQuery("SELECT @@read_only = 0"))
}

// scriptConn serves fixed bytes in reads of at most chunk bytes, then io.EOF.
type scriptConn struct {
	net.Conn
	data  []byte
	chunk int
	reads int
}

func (c *scriptConn) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	c.reads++
	n := copy(p[:min(len(p), c.chunk)], c.data)
	c.data = c.data[n:]
	return n, nil
}

func (c *scriptConn) Write(p []byte) (int, error) { return len(p), nil }

func packet(payload []byte, seq byte) []byte {
	n := len(payload)
	return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq}, payload...)
}

func TestMySQLPacketConn(t *testing.T) {
	small := append(packet([]byte("hello"), 0), packet(bytes.Repeat([]byte("p"), 60<<10), 1)...)
	for _, chunk := range []int{1, 3, 4, 5, 4096, 1 << 20} {
		t.Run("packets within the bound pass whole", func(t *testing.T) {
			c := newMySQLPacketConn(&scriptConn{data: bytes.Clone(small), chunk: chunk}, nil)
			got, err := io.ReadAll(c)
			require.NoError(t, err)
			assert.Equal(t, small, got)
		})
		t.Run("a header over the bound is never handed on", func(t *testing.T) {
			data := append(packet([]byte("ok"), 0), 0xff, 0xff, 0xff, 1, 'x', 'y')
			c := newMySQLPacketConn(&scriptConn{data: data, chunk: chunk}, nil)
			got, err := io.ReadAll(c)
			assert.Equal(t, packet([]byte("ok"), 0), got, "only the packet before it")
			assert.ErrorIs(t, err, errMySQLPacketTooLarge)
			assert.ErrorIs(t, c.firstError(), errMySQLPacketTooLarge)
		})
	}
	// Under TLS the relay checks the same headers in plain text (mysqltls.go).
	for _, chunk := range []int{1, 3, 4, 5, 4096} {
		t.Run("the relay's framer passes packets within the bound and refuses a header over it", func(t *testing.T) {
			var f mysqlFramer
			for b := small; len(b) > 0; b = b[min(chunk, len(b)):] {
				require.NoError(t, f.check(b[:min(chunk, len(b))]))
			}
			data := append(packet([]byte("ok"), 0), 0xff, 0xff, 0xff, 1, 'x', 'y')
			var bad mysqlFramer
			var err error
			for b := data; len(b) > 0 && err == nil; b = b[min(chunk, len(b)):] {
				err = bad.check(b[:min(chunk, len(b))])
			}
			assert.ErrorIs(t, err, errMySQLPacketTooLarge)
		})
	}
	t.Run("the first error is kept", func(t *testing.T) {
		c := newMySQLPacketConn(&scriptConn{data: []byte{1, 0}, chunk: 4096}, nil)
		_, err := io.ReadAll(c)
		assert.True(t, err == nil || errors.Is(err, io.EOF))
		assert.ErrorIs(t, c.firstError(), io.EOF)
	})
}
