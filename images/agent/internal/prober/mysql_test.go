// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/credentials"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/prober"
	"github.com/deckhouse/service-with-healthchecks/testkit/mariadb"
	"github.com/deckhouse/service-with-healthchecks/testkit/pki"
)

// Password of the MariaDB test account; it must never show up in a log or a reason.
const myAppPassword = "my-app-Pa55word-never-logged"

// sharedMy is a MariaDB primary (TLS, its certificate names 127.0.0.1) and a replica that
// replicates it for real (no TLS, read_only=1), started once for the package.
type sharedMy struct {
	ca, otherCA      *pki.CA
	client           pki.Pair
	primary, replica *mariadb.Server
}

var (
	myOnce   sync.Once
	myShared *sharedMy
	myErr    error
)

func stopSharedMariaDB() {
	if myShared == nil {
		return
	}
	for _, s := range []*mariadb.Server{myShared.replica, myShared.primary} {
		if s != nil {
			if err := s.Remove(); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}
	}
}

func myServers(t testing.TB) *sharedMy {
	t.Helper()
	myOnce.Do(func() { myShared, myErr = startSharedMy() })
	require.NoError(t, myErr, "starting the shared MariaDB servers")
	return myShared
}

func startSharedMy() (*sharedMy, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := &sharedMy{}
	var err error
	if s.ca, err = pki.NewCA("my-ca"); err != nil {
		return nil, err
	}
	if s.otherCA, err = pki.NewCA("other-ca"); err != nil {
		return nil, err
	}
	if s.client, err = s.ca.Client("certuser"); err != nil {
		return nil, err
	}
	cert, err := s.ca.Server("primary", []string{"primary.db.example"}, []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		return nil, err
	}
	s.primary, err = mariadb.Start(ctx, mariadb.Options{TLS: &mariadb.TLS{CertPEM: cert.CertPEM, KeyPEM: cert.KeyPEM, ClientCAPEM: s.ca.CertPEM}})
	if err != nil {
		return s, err
	}
	if s.replica, err = s.primary.StartReplica(ctx, mariadb.Options{}); err != nil {
		return s, err
	}
	// Created after the replica started, so they reach it by replication.
	for _, stmt := range []string{
		"CREATE USER 'app'@'%' IDENTIFIED BY '" + myAppPassword + "'",
		"CREATE USER 'certuser'@'%' REQUIRE SUBJECT '/CN=certuser'",
		"CREATE DATABASE appdb",
		"CREATE TABLE appdb.probe_writes (v int)",
		"GRANT SELECT, INSERT ON appdb.* TO 'app'@'%'",
		"GRANT SELECT ON appdb.* TO 'certuser'@'%'",
	} {
		if err := s.primary.Exec(ctx, stmt); err != nil {
			return s, err
		}
	}
	return s, waitReplicated(ctx, s.replica)
}

// waitReplicated polls until the replica has the grant the primary made last (startSharedMy's
// last statement): the replica cases log in as app to appdb, so they need its grant too, not only
// the account (waiting for certuser's account alone let a loaded machine run "the read-only
// replica refuses a write" before the grants arrived: access denied instead of read-only).
func waitReplicated(ctx context.Context, replica *mariadb.Server) error {
	for {
		n, err := replica.QueryInt(ctx, "SELECT COUNT(*) FROM mysql.db WHERE Db = 'appdb' AND User = 'certuser'")
		if err == nil && n == 1 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the replica did not replicate the accounts and grants (last error: %w): %w", err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func mySecret(data map[string]string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db"}, Type: wellknown.SecretTypeMySQLCredentials, Data: map[string][]byte{}}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

func myProbe(query, dbName, secret string, timeout int32) v1alpha1.Probe {
	return v1alpha1.Probe{Mode: v1alpha1.ProbeModeMySQL, TimeoutSeconds: timeout,
		MySQL: &v1alpha1.MySQLProbe{TargetPort: intstr.FromInt32(1), Query: query, DBName: dbName, AuthSecretName: secret}}
}

// probeMy runs a probe with a logger that keeps everything and checks that the password shows
// up neither in the log nor in the reason.
func probeMy(t *testing.T, creds staticCredentials, probe v1alpha1.Probe, host string, port int) prober.Result {
	t.Helper()
	logs := &logBuffer{}
	p := prober.New(prober.Options{Credentials: creds, Logger: logs.logger()})
	res, err := p.Probe(t.Context(), probe, "ns", host, int32(port))
	require.NoError(t, err)
	require.NotEmpty(t, logs.String())
	require.NotContains(t, logs.String(), myAppPassword, "password in the log")
	require.NotContains(t, res.Reason, myAppPassword, "password in the reason")
	return res
}

func TestMySQLResults(t *testing.T) {
	s := myServers(t)
	app := map[string]string{"user": "app", "password": myAppPassword}
	pass := prober.Result{Outcome: prober.Success, Reason: "query returned a true value"}
	fail := func(reason string) prober.Result { return prober.Result{Outcome: prober.Failure, Reason: reason} }
	withTLS := func(mode string, ca []byte, extra map[string]string) map[string]string {
		m := map[string]string{"user": "app", "password": myAppPassword, "tlsMode": mode}
		if ca != nil {
			m["caCert"] = string(ca)
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	cases := map[string]struct {
		secret  map[string]string
		typ     string
		query   string
		dbName  string
		replica bool
		want    prober.Result
	}{
		"SELECT 1 passes":                       {secret: app, want: pass},
		"the default query passes":              {secret: app, query: "", want: pass},
		"TRUE passes":                           {secret: app, query: "SELECT TRUE", want: pass},
		"a non-zero integer passes":             {secret: app, query: "SELECT -7", want: pass},
		"a non-zero DECIMAL passes":             {secret: app, query: "SELECT 0.5", want: pass},
		"the text true passes":                  {secret: app, query: "SELECT 'True'", want: pass},
		"an unsigned BIGINT passes":             {secret: app, query: "SELECT CAST(18446744073709551615 AS UNSIGNED)", want: pass},
		"0 fails":                               {secret: app, query: "SELECT 0", want: fail("query returned false (0)")},
		"FALSE fails":                           {secret: app, query: "SELECT FALSE", want: fail("query returned false (0)")},
		"a zero DECIMAL fails":                  {secret: app, query: "SELECT 0.00", want: fail("query returned false (0.00)")},
		"a zero DOUBLE fails":                   {secret: app, query: "SELECT CAST(0 AS DOUBLE)", want: fail("query returned false (0)")},
		"NULL fails":                            {secret: app, query: "SELECT NULL", want: fail("query returned NULL")},
		"no row fails":                          {secret: app, query: "SELECT 1 FROM DUAL WHERE 1 = 0", want: fail("query returned no rows")},
		"other text fails and is named":         {secret: app, query: "SELECT 'yes please'", want: fail(`query returned "yes please", not a number or true`)},
		"the primary is writable":               {secret: app, query: "SELECT @@read_only = 0", want: pass},
		"the replica is not":                    {secret: app, query: "SELECT @@read_only = 0", replica: true, want: fail("query returned false (0)")},
		"the replica answers SELECT 1":          {secret: app, replica: true, want: pass},
		"a database of the account":             {secret: app, dbName: "appdb", query: "SELECT COUNT(*) = 0 FROM probe_writes", want: pass},
		"the query runs read-only":              {secret: app, dbName: "appdb", query: "INSERT INTO probe_writes VALUES (1)", want: fail("query error: Cannot execute statement in a READ ONLY transaction (MySQL error 1792)")},
		"two statements are refused":            {secret: app, query: "SELECT 1; SELECT 1", want: fail("query error: You have an error in your SQL syntax; check the manual that corresponds to your MariaDB server version for the right syntax to use near 'SELECT 1' at line 1 (MySQL error 1064)")},
		"a query error is named":                {secret: app, query: "SELECT nosuchcolumn", want: fail("query error: Unknown column 'nosuchcolumn' in 'SELECT' (MySQL error 1054)")},
		"an unknown database":                   {secret: app, dbName: "nope", want: fail("access denied for user 'app'@'%' to database 'nope' (MySQL error 1044)")},
		"a wrong password is access denied":     {secret: map[string]string{"user": "app", "password": "wrong"}, want: fail("access denied for user 'app'@'127.0.0.1' (using password: YES) (MySQL error 1045)")},
		"no Secret logs in as root":             {want: pass}, // mariadb-install-db's root@127.0.0.1 has no password.
		"a PostgreSQL Secret is refused":        {secret: app, typ: wellknown.SecretTypePostgreSQLCredentials, want: fail("credentials Secret ns/db has type network.deckhouse.io/postgresql-credentials, this probe needs network.deckhouse.io/mysql-credentials")},
		"TLS SkipVerification":                  {secret: withTLS("SkipVerification", nil, nil), want: pass},
		"TLS VerifyCA":                          {secret: withTLS("VerifyCA", s.ca.CertPEM, nil), want: pass},
		"TLS VerifyAll":                         {secret: withTLS("VerifyAll", s.ca.CertPEM, nil), want: pass},
		"TLS VerifyCA with another CA":          {secret: withTLS("VerifyCA", s.otherCA.CertPEM, nil), want: fail("TLS: certificate signed by unknown authority")},
		"TLS to a server without TLS":           {secret: withTLS("SkipVerification", nil, nil), replica: true, want: fail("TLS: server does not accept TLS")},
		"a client certificate logs in":          {secret: map[string]string{"user": "certuser", "tlsMode": "VerifyAll", "caCert": string(s.ca.CertPEM), "clientCert": string(s.client.CertPEM), "clientKey": string(s.client.KeyPEM)}, want: pass},
		"no client certificate, no login":       {secret: map[string]string{"user": "certuser", "tlsMode": "VerifyAll", "caCert": string(s.ca.CertPEM)}, want: fail("access denied for user 'certuser'@'127.0.0.1' (using password: NO) (MySQL error 1045)")},
		"the read-only replica refuses a write": {secret: app, replica: true, dbName: "appdb", query: "INSERT INTO probe_writes VALUES (1)", want: fail("query error: The MariaDB server is running with the --read-only option so it cannot execute this statement (MySQL error 1290)")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			creds := staticCredentials{}
			secretName := ""
			if tc.secret != nil {
				sec := mySecret(tc.secret)
				if tc.typ != "" {
					sec.Type = corev1.SecretType(tc.typ)
				}
				creds["db"], secretName = sec, "db"
			}
			query := tc.query
			if query == "" && name != "the default query passes" {
				query = "SELECT 1"
			}
			srv := s.primary
			if tc.replica {
				srv = s.replica
			}
			got := probeMy(t, creds, myProbe(query, tc.dbName, secretName, 5), srv.Host, srv.Port)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestMySQLUnreachableAndRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedPort := port(l)
	require.NoError(t, l.Close())
	res := probeMy(t, staticCredentials{}, myProbe("SELECT 1", "", "", 1), "127.0.0.1", int(closedPort))
	assert.Equal(t, prober.Result{Outcome: prober.Failure, Reason: "connection refused"}, res)

	// A server that accepts and never says a word: the deadline ends the probe.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer silent.Close()
	start := time.Now()
	res = probeMy(t, staticCredentials{}, myProbe("SELECT 1", "", "", 1), "127.0.0.1", int(port(silent)))
	assert.Equal(t, prober.Result{Outcome: prober.Failure, Reason: "timeout after 1s"}, res)
	assert.Less(t, time.Since(start), deadlineBound(1))
}

// TestMySQLFailoverFollowsTheWritableServer swaps the roles of two servers as a failover does
// and checks that SELECT @@read_only = 0 follows the writable one.
func TestMySQLFailoverFollowsTheWritableServer(t *testing.T) {
	a := mariadb.StartForTest(t, mariadb.Options{ServerID: 11})
	b := mariadb.StartForTest(t, mariadb.Options{ServerID: 12})
	require.NoError(t, b.ReplicateFrom(t.Context(), a))
	for _, srv := range []*mariadb.Server{a, b} {
		// Created on each, replication is not what this test checks.
		require.NoError(t, srv.Exec(t.Context(), "SET sql_log_bin = 0; CREATE USER 'app'@'%' IDENTIFIED BY '"+myAppPassword+"'"))
	}
	creds := staticCredentials{"db": mySecret(map[string]string{"user": "app", "password": myAppPassword})}
	writable := func(srv *mariadb.Server) prober.Outcome {
		return probeMy(t, creds, myProbe("SELECT @@read_only = 0", "", "db", 5), srv.Host, srv.Port).Outcome
	}
	assert.Equal(t, prober.Success, writable(a))
	assert.Equal(t, prober.Failure, writable(b))
	require.NoError(t, a.SetReadOnly(t.Context(), true))
	require.NoError(t, b.Promote(t.Context()))
	assert.Equal(t, prober.Failure, writable(a))
	assert.Equal(t, prober.Success, writable(b))
	// The old primary stopped: refused, and the new one still writable.
	require.NoError(t, a.Stop(t.Context()))
	res := probeMy(t, creds, myProbe("SELECT @@read_only = 0", "", "db", 1), a.Host, a.Port)
	assert.Equal(t, prober.Result{Outcome: prober.Failure, Reason: "connection refused"}, res)
	assert.Equal(t, prober.Success, writable(b))
}

// TestMySQLWithASecretStillLoadingIsDeferred: a probe whose Secret is still loading counts for nothing.
func TestMySQLWithASecretStillLoadingIsDeferred(t *testing.T) {
	p := prober.New(prober.Options{Credentials: loadingCredentials{}})
	res, err := p.Probe(t.Context(), myProbe("SELECT 1", "", "db", 1), "ns", "127.0.0.1", 1)
	require.NoError(t, err)
	assert.Equal(t, prober.Deferred, res.Outcome)
	assert.Contains(t, res.Reason, credentials.ErrLoading.Error())
}
