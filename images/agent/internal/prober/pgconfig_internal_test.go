// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/credentials"
	"github.com/deckhouse/service-with-healthchecks/testkit/pki"
)

func TestPGConfigDialsOnlyThePodWithTheSecretsLogin(t *testing.T) {
	ca, err := pki.NewCA("pg-ca")
	require.NoError(t, err)
	client, err := ca.Client("certuser")
	require.NoError(t, err)
	clientCert, err := client.TLSCertificate()
	require.NoError(t, err)
	// A template with everything a probe must not keep: a second host (a fallback), a
	// timeout of its own, TLS, other parameters.
	tmpl, err := pgconn.ParseConfig("host=192.0.2.1,192.0.2.2 port=5433,5434 user=someone password=secret dbname=other " +
		"sslmode=disable connect_timeout=7 application_name=other search_path=elsewhere")
	require.NoError(t, err)
	require.NotEmpty(t, tmpl.Fallbacks, "the template has a fallback to drop")

	type want struct {
		user, requireAuth string
		withTLS           bool
		insecure          bool
		verifyConnection  bool
		serverName        string
		roots             bool
		clientCerts       int
	}
	cases := map[string]struct {
		creds *credentials.Credentials
		addr  netip.AddrPort
		want  want
	}{
		"no Secret: the default role, SCRAM or nothing, no TLS": {
			addr: netip.MustParseAddrPort("10.0.0.7:5432"), want: want{user: "postgres", requireAuth: requireSCRAM},
		},
		"Disabled: no TLS, SCRAM required": {
			creds: &credentials.Credentials{User: "app", TLSMode: credentials.TLSDisabled},
			addr:  netip.MustParseAddrPort("10.0.0.7:5432"), want: want{user: "app", requireAuth: requireSCRAM},
		},
		"SkipVerification: TLS without checks, SCRAM required": {
			creds: &credentials.Credentials{User: "app", TLSMode: credentials.TLSSkipVerification},
			addr:  netip.MustParseAddrPort("10.0.0.7:5432"), want: want{user: "app", requireAuth: requireSCRAM, withTLS: true, insecure: true},
		},
		"VerifyCA: the chain checked by hand, not the name, SCRAM required": {
			creds: &credentials.Credentials{User: "app", TLSMode: credentials.TLSVerifyCA, RootCAs: ca.Pool},
			addr:  netip.MustParseAddrPort("10.0.0.7:5432"),
			want:  want{user: "app", requireAuth: requireSCRAM, withTLS: true, insecure: true, verifyConnection: true},
		},
		"VerifyAll: chain and pod IP checked, any password method": {
			creds: &credentials.Credentials{User: "app", TLSMode: credentials.TLSVerifyAll, RootCAs: ca.Pool},
			addr:  netip.MustParseAddrPort("10.0.0.7:5432"), want: want{user: "app", withTLS: true, serverName: "10.0.0.7", roots: true},
		},
		"VerifyAll on IPv6: the name is the bare address": {
			creds: &credentials.Credentials{User: "app", TLSMode: credentials.TLSVerifyAll, RootCAs: ca.Pool},
			addr:  netip.MustParseAddrPort("[2001:db8::7]:5432"), want: want{user: "app", withTLS: true, serverName: "2001:db8::7", roots: true},
		},
		"VerifyAll with a client certificate": {
			creds: &credentials.Credentials{User: "certuser", TLSMode: credentials.TLSVerifyAll, RootCAs: ca.Pool, ClientCertificate: &clientCert},
			addr:  netip.MustParseAddrPort("10.0.0.7:5432"), want: want{user: "certuser", withTLS: true, serverName: "10.0.0.7", roots: true, clientCerts: 1},
		},
		"SkipVerification with a client certificate": {
			creds: &credentials.Credentials{User: "certuser", TLSMode: credentials.TLSSkipVerification, ClientCertificate: &clientCert},
			addr:  netip.MustParseAddrPort("10.0.0.7:5432"), want: want{user: "certuser", requireAuth: requireSCRAM, withTLS: true, insecure: true, clientCerts: 1},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := pgConfig(tmpl, tc.addr, "appdb", tc.creds)
			assert.Equal(t, tc.addr.Addr().String(), cfg.Host)
			assert.Equal(t, tc.addr.Port(), cfg.Port)
			assert.Equal(t, "appdb", cfg.Database)
			assert.Empty(t, cfg.Password, "no password without one in the Secret")
			assert.Empty(t, cfg.Fallbacks, "no other host")
			assert.Zero(t, cfg.ConnectTimeout, "the probe's context carries the deadline")
			assert.Nil(t, cfg.ValidateConnect)
			assert.Nil(t, cfg.AfterConnect)
			assert.Empty(t, cfg.SSLNegotiation)
			assert.Equal(t, map[string]string{"application_name": applicationName}, cfg.RuntimeParams)
			assert.Equal(t, uint32(maxPostgreSQLMessageBytes), uint32(cfg.MaxProtocolMessageBodyLen))
			hosts, err := cfg.LookupFunc(t.Context(), "elsewhere.example")
			require.NoError(t, err)
			assert.Equal(t, []string{tc.addr.Addr().String()}, hosts, "every name resolves to the pod")

			c := cfg.TLSConfig
			got := want{user: cfg.User, requireAuth: cfg.RequireAuth, withTLS: c != nil}
			if c != nil {
				got.insecure, got.verifyConnection, got.serverName = c.InsecureSkipVerify, c.VerifyConnection != nil, c.ServerName
				got.roots, got.clientCerts = c.RootCAs != nil, len(c.Certificates)
				assert.Equal(t, uint16(tls.VersionTLS12), c.MinVersion)
			}
			assert.Equal(t, tc.want, got)
		})
	}
	assert.Equal(t, "192.0.2.1", tmpl.Host, "the template is not changed")
}

func TestPGConfigDialsThePodWhateverItIsAskedFor(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = l.Close() }()
	addr := netip.MustParseAddrPort(l.Addr().String())
	tmpl, err := pgTemplate()
	require.NoError(t, err)
	cfg := pgConfig(tmpl, addr, "postgres", nil)

	c, err := cfg.DialFunc(t.Context(), "tcp", "192.0.2.1:5432")
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	assert.Equal(t, l.Addr().String(), c.RemoteAddr().String())
	assert.IsType(t, &limitedConn{}, c, "reads go through the per-probe bound")
}

func TestVerifyCAChecksTheChainNotTheName(t *testing.T) {
	ca, err := pki.NewCA("pg-ca")
	require.NoError(t, err)
	otherCA, err := pki.NewCA("other-ca")
	require.NoError(t, err)
	leaf := func(issuer *pki.CA) *x509.Certificate {
		pair, err := issuer.Server("db", []string{"db.example"}, nil)
		require.NoError(t, err)
		cert, err := pair.TLSCertificate()
		require.NoError(t, err)
		parsed, err := x509.ParseCertificate(cert.Certificate[0])
		require.NoError(t, err)
		return parsed
	}
	cfg := credentialsTLSConfig(&credentials.Credentials{TLSMode: credentials.TLSVerifyCA, RootCAs: ca.Pool}, netip.MustParseAddr("10.0.0.7"))
	cases := map[string]struct {
		peers []*x509.Certificate
		check func(t *testing.T, err error)
	}{
		"a certificate of the CA for another name passes": {
			peers: []*x509.Certificate{leaf(ca)},
			check: func(t *testing.T, err error) { assert.NoError(t, err) },
		},
		"a certificate of another CA fails": {
			peers: []*x509.Certificate{leaf(otherCA)},
			check: func(t *testing.T, err error) {
				var unknown x509.UnknownAuthorityError
				assert.True(t, errors.As(err, &unknown), "got %v", err)
			},
		},
		"no certificate fails": {
			check: func(t *testing.T, err error) { assert.EqualError(t, err, "server sent no certificate") },
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tc.check(t, cfg.VerifyConnection(tls.ConnectionState{PeerCertificates: tc.peers}))
		})
	}
}

func TestBeginReadOnlySetsTheStatementTimeout(t *testing.T) {
	cases := map[string]struct {
		remaining   time.Duration
		hasDeadline bool
		want        string
	}{
		"nine tenths of the time left":            {remaining: 5 * time.Second, hasDeadline: true, want: "BEGIN READ ONLY; SET LOCAL statement_timeout = 4500"},
		"a short time left":                       {remaining: 10 * time.Millisecond, hasDeadline: true, want: "BEGIN READ ONLY; SET LOCAL statement_timeout = 9"},
		"under a millisecond is one":              {remaining: time.Millisecond, hasDeadline: true, want: "BEGIN READ ONLY; SET LOCAL statement_timeout = 1"},
		"no time left is one, not 0 (no timeout)": {remaining: 0, hasDeadline: true, want: "BEGIN READ ONLY; SET LOCAL statement_timeout = 1"},
		"a passed deadline is one":                {remaining: -time.Second, hasDeadline: true, want: "BEGIN READ ONLY; SET LOCAL statement_timeout = 1"},
		"no deadline is one second":               {remaining: -time.Hour, want: "BEGIN READ ONLY; SET LOCAL statement_timeout = 1000"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, beginReadOnly(tc.remaining, tc.hasDeadline))
		})
	}
}

func TestQueryVerdict(t *testing.T) {
	row := func(values ...string) [][]byte {
		out := make([][]byte, len(values))
		for i, v := range values {
			out[i] = []byte(v)
		}
		return out
	}
	cases := map[string]struct {
		gotRow bool
		values [][]byte
		want   Result
	}{
		"no row":                             {want: failure("query returned no rows")},
		"a row without columns":              {gotRow: true, values: [][]byte{}, want: failure("query returned no columns")},
		"NULL":                               {gotRow: true, values: [][]byte{nil}, want: failure("query returned NULL")},
		"t":                                  {gotRow: true, values: row("t"), want: success("query returned a true value")},
		"true":                               {gotRow: true, values: row("true"), want: success("query returned a true value")},
		"1":                                  {gotRow: true, values: row("1"), want: success("query returned a true value")},
		"any other text":                     {gotRow: true, values: row("primary"), want: success("query returned a true value")},
		"an empty string is not false":       {gotRow: true, values: row(""), want: success("query returned a true value")},
		"only the first column counts":       {gotRow: true, values: row("t", "f"), want: success("query returned a true value")},
		"f":                                  {gotRow: true, values: row("f"), want: failure("query returned false")},
		"false in any case":                  {gotRow: true, values: row("FaLsE"), want: failure("query returned false")},
		"f with spaces":                      {gotRow: true, values: row("  f\n"), want: failure("query returned false")},
		"0 is false and named":               {gotRow: true, values: row("0"), want: failure("query returned false (0)")},
		"no is false and named":              {gotRow: true, values: row("No"), want: failure("query returned false (No)")},
		"off is false and named, trimmed":    {gotRow: true, values: row(" off "), want: failure("query returned false (off)")},
		"0.0 is not one of the false values": {gotRow: true, values: row("0.0"), want: success("query returned a true value")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, queryVerdict(tc.gotRow, tc.values))
		})
	}
}

func TestPGDefaults(t *testing.T) {
	assert.Equal(t, v1alpha1.DefaultPostgreSQLQuery, pgQuery(""))
	assert.Equal(t, v1alpha1.DefaultPostgreSQLQuery, pgQuery(" \n\t"))
	assert.Equal(t, "SELECT pg_is_in_recovery()", pgQuery("SELECT pg_is_in_recovery()"))
	assert.Equal(t, v1alpha1.DefaultPostgreSQLDBName, pgDBName(""))
	assert.Equal(t, "app", pgDBName("app"))
}
