// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober_test

import (
	"context"
	"crypto/md5" //nolint:gosec // PostgreSQL's MD5 password format, for a test role.
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/credentials"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/prober"
	"github.com/deckhouse/service-with-healthchecks/testkit/pki"
	"github.com/deckhouse/service-with-healthchecks/testkit/postgres"
)

// Passwords of the test roles; none may ever show up in a log, a reason or an error.
const (
	appPassword   = "app-Pa55word-never-logged"
	clearPassword = "clear-Pa55word-never-logged"
	md5Password   = "md5-Pa55word-never-logged"
	wrongPassword = "wrong-Pa55word-never-logged"
)

var allPasswords = []string{appPassword, clearPassword, md5Password, wrongPassword}

// shared is one primary (TLS with the IP 127.0.0.1 in its certificate) and its replica (TLS with
// a certificate that names only a DNS name), started once for the package.
type sharedPG struct {
	ca, otherCA      *pki.CA
	client           pki.Pair
	primary, replica *postgres.Server
}

var (
	pgOnce   sync.Once
	pgShared *sharedPG
	pgErr    error
)

func stopSharedPostgres() {
	if pgShared == nil {
		return
	}
	for _, s := range []*postgres.Server{pgShared.replica, pgShared.primary} {
		if s != nil {
			if err := s.Remove(); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}
	}
}

func pgServers(t testing.TB) *sharedPG {
	t.Helper()
	pgOnce.Do(func() { pgShared, pgErr = startSharedPG() })
	require.NoError(t, pgErr, "starting the shared PostgreSQL servers")
	return pgShared
}

// pgHBA gives each test role its own authentication method on the same server.
var pgHBA = []string{
	"hostssl all certuser all cert",
	"host all clearuser all password",
	"host all md5user all md5",
	postgres.HBASCRAM,
}

func startSharedPG() (*sharedPG, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := &sharedPG{}
	var err error
	if s.ca, err = pki.NewCA("pg-ca"); err != nil {
		return nil, err
	}
	if s.otherCA, err = pki.NewCA("other-ca"); err != nil {
		return nil, err
	}
	if s.client, err = s.ca.Client("certuser"); err != nil {
		return nil, err
	}
	primaryCert, err := s.ca.Server("primary", []string{"primary.db.example"}, []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		return nil, err
	}
	replicaCert, err := s.ca.Server("replica", []string{"replica.db.example"}, nil)
	if err != nil {
		return nil, err
	}
	s.primary, err = postgres.Start(ctx, postgres.Options{HBA: pgHBA, TLS: &postgres.TLS{
		CertPEM: primaryCert.CertPEM, KeyPEM: primaryCert.KeyPEM, ClientCAPEM: s.ca.CertPEM}})
	if err != nil {
		return s, err
	}
	for _, stmt := range []string{
		"CREATE ROLE app LOGIN PASSWORD '" + appPassword + "'",
		"CREATE ROLE clearuser LOGIN PASSWORD '" + clearPassword + "'",
		// A password given as an MD5 hash is stored as one, whatever password_encryption
		// says, so the server asks this role for MD5.
		"CREATE ROLE md5user LOGIN PASSWORD '" + md5Hash(md5Password, "md5user") + "'",
		"CREATE ROLE certuser LOGIN",
		"CREATE DATABASE appdb OWNER app",
		"CREATE TABLE probe_writes (v int)",
		"GRANT SELECT, INSERT, DELETE ON probe_writes TO app",
	} {
		if err := s.primary.Exec(ctx, stmt); err != nil {
			return s, err
		}
	}
	s.replica, err = s.primary.StartReplica(ctx, postgres.Options{TLS: &postgres.TLS{
		CertPEM: replicaCert.CertPEM, KeyPEM: replicaCert.KeyPEM, ClientCAPEM: s.ca.CertPEM}})
	return s, err
}

// md5Hash is PostgreSQL's stored form of an MD5 password.
func md5Hash(password, user string) string {
	sum := md5.Sum([]byte(password + user))
	return "md5" + hex.EncodeToString(sum[:])
}

// staticCredentials serves Secrets parsed by the real parser, without an API server (the store
// itself is tested against one in package credentials).
type staticCredentials map[string]*corev1.Secret

func (s staticCredentials) Lookup(namespace, name string) (*credentials.Credentials, error) {
	sec, ok := s[name]
	if !ok {
		return nil, &credentials.Error{Secret: types.NamespacedName{Namespace: namespace, Name: name}, Problem: "not found"}
	}
	c, err := credentials.Parse(sec)
	if err != nil {
		return nil, &credentials.Error{Secret: types.NamespacedName{Namespace: namespace, Name: name}, Problem: err.Error()}
	}
	return c, nil
}

func pgSecret(data map[string]string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db"}, Type: wellknown.SecretTypePostgreSQLCredentials, Data: map[string][]byte{}}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

func pgProbe(query, dbName, secret string, timeout int32) v1alpha1.Probe {
	return v1alpha1.Probe{Mode: v1alpha1.ProbeModePostgreSQL, TimeoutSeconds: timeout,
		PostgreSQL: &v1alpha1.PostgreSQLProbe{TargetPort: intstr.FromInt32(1), Query: query, DBName: dbName, AuthSecretName: secret}}
}

// probePG runs a probe with a logger that keeps everything, and checks that no password shows up
// in the log, the reason or the error.
func probePG(t *testing.T, creds staticCredentials, probe v1alpha1.Probe, srv *postgres.Server) prober.Result {
	t.Helper()
	logs := &logBuffer{}
	p := prober.New(prober.Options{Credentials: creds, Logger: logs.logger()})
	res, err := p.Probe(t.Context(), probe, "ns", srv.Host, int32(srv.Port))
	require.NoError(t, err)
	require.NotEmpty(t, logs.String(), "the probe logs at V(4), so the password check below looks at real output")
	for _, pw := range allPasswords {
		require.NotContains(t, logs.String(), pw, "password in the log")
		require.NotContains(t, res.Reason, pw, "password in the reason")
	}
	return res
}

func TestPostgreSQLResults(t *testing.T) {
	pg := pgServers(t)
	secrets := staticCredentials{
		"app":       pgSecret(map[string]string{"user": "app", "password": appPassword}),
		"app-wrong": pgSecret(map[string]string{"user": "app", "password": wrongPassword}),
		"app-skip":  pgSecret(map[string]string{"user": "app", "password": appPassword, "tlsMode": "SkipVerification"}),
		"app-ca":    pgSecret(map[string]string{"user": "app", "password": appPassword, "tlsMode": "VerifyCA", "caCert": string(pg.ca.CertPEM)}),
		"app-all":   pgSecret(map[string]string{"user": "app", "password": appPassword, "tlsMode": "VerifyAll", "caCert": string(pg.ca.CertPEM)}),
		"app-other": pgSecret(map[string]string{"user": "app", "password": appPassword, "tlsMode": "VerifyCA", "caCert": string(pg.otherCA.CertPEM)}),
		"cert": pgSecret(map[string]string{"user": "certuser", "tlsMode": "VerifyAll", "caCert": string(pg.ca.CertPEM),
			"clientCert": string(pg.client.CertPEM), "clientKey": string(pg.client.KeyPEM)}),
		"cert-nokey": pgSecret(map[string]string{"user": "certuser", "tlsMode": "VerifyAll", "caCert": string(pg.ca.CertPEM)}),
		"clear":      pgSecret(map[string]string{"user": "clearuser", "password": clearPassword}),
		"clear-skip": pgSecret(map[string]string{"user": "clearuser", "password": clearPassword, "tlsMode": "SkipVerification"}),
		"clear-ca":   pgSecret(map[string]string{"user": "clearuser", "password": clearPassword, "tlsMode": "VerifyCA", "caCert": string(pg.ca.CertPEM)}),
		"clear-all":  pgSecret(map[string]string{"user": "clearuser", "password": clearPassword, "tlsMode": "VerifyAll", "caCert": string(pg.ca.CertPEM)}),
		"md5":        pgSecret(map[string]string{"user": "md5user", "password": md5Password}),
		"md5-ca":     pgSecret(map[string]string{"user": "md5user", "password": md5Password, "tlsMode": "VerifyCA", "caCert": string(pg.ca.CertPEM)}),
		"md5-all":    pgSecret(map[string]string{"user": "md5user", "password": md5Password, "tlsMode": "VerifyAll", "caCert": string(pg.ca.CertPEM)}),
		"wrong-type": func() *corev1.Secret {
			s := pgSecret(map[string]string{"user": "app"})
			s.Type = corev1.SecretTypeOpaque
			return s
		}(),
		"no-password": pgSecret(map[string]string{"user": "app"}),
	}
	pass := prober.Result{Outcome: prober.Success, Reason: "query returned a true value"}
	fail := func(reason string) prober.Result { return prober.Result{Outcome: prober.Failure, Reason: reason} }
	refused := func(method string) prober.Result {
		return fail("refused to authenticate: server asked for " + method + " authentication, which needs tlsMode VerifyAll (SCRAM is required otherwise)")
	}
	refusedUnderVerifyCA := func(method string) prober.Result {
		return fail("refused to authenticate: server asked for " + method + " authentication; tlsMode VerifyCA does not prove which server answers, " +
			"so only SCRAM is allowed (use VerifyAll with the pod IP in the certificate, or SCRAM on the server)")
	}
	longValue := strings.Repeat("x", 1000)
	longError := `invalid input syntax for type integer: "` + longValue + `"`

	cases := map[string]struct {
		query, db, secret string
		replica           bool
		want              prober.Result
	}{
		"the default query passes":                      {secret: "app", want: pass},
		"NOT pg_is_in_recovery() passes on the primary": {query: "SELECT NOT pg_is_in_recovery()", secret: "app", want: pass},
		"NOT pg_is_in_recovery() fails on the replica":  {query: "SELECT NOT pg_is_in_recovery()", secret: "app", replica: true, want: fail("query returned false")},
		"a text value passes":                           {query: "SELECT 'yes'", secret: "app", want: pass},
		"false fails":                                   {query: "SELECT false", secret: "app", want: fail("query returned false")},
		"0 fails":                                       {query: "SELECT 0", secret: "app", want: fail("query returned false (0)")},
		"'off' fails":                                   {query: "SELECT 'off'", secret: "app", want: fail("query returned false (off)")},
		"'NO' fails":                                    {query: "SELECT 'NO'", secret: "app", want: fail("query returned false (NO)")},
		"NULL fails":                                    {query: "SELECT NULL", secret: "app", want: fail("query returned NULL")},
		"no rows fail":                                  {query: "SELECT 1 WHERE false", secret: "app", want: fail("query returned no rows")},
		"a query error fails with the server's message":                     {query: "SELECT * FROM missing_table", secret: "app", want: fail(`query error: relation "missing_table" does not exist (SQLSTATE 42P01)`)},
		"a long server message is cut, and its SQLSTATE kept":               {query: "SELECT '" + longValue + "'::int", secret: "app", want: fail("query error: " + longError[:197] + "… (SQLSTATE 22P02)")},
		"a wrong password fails as authentication":                          {secret: "app-wrong", want: fail("authentication failed (wrong user or password) (SQLSTATE 28P01)")},
		"a missing database fails as such":                                  {db: "nodb", secret: "app", want: fail(`database "nodb" does not exist (SQLSTATE 3D000)`)},
		"another database can be named":                                     {db: "appdb", query: "SELECT current_database() = 'appdb'", secret: "app", want: pass},
		"without a Secret a server that wants a password fails":             {want: fail("authentication failed: the server wants a password, set postgreSQL.authSecretName (SQLSTATE 28P01)")},
		"a missing Secret fails naming it":                                  {secret: "absent", want: fail("credentials Secret ns/absent: not found")},
		"a Secret of another type fails as wrong type":                      {secret: "wrong-type", want: fail(`credentials Secret ns/wrong-type: wrong type "Opaque", want network.deckhouse.io/postgresql-credentials or network.deckhouse.io/mysql-credentials`)},
		"a Secret without password fails SCRAM":                             {secret: "no-password", want: fail("authentication failed (wrong user or password) (SQLSTATE 28P01)")},
		"TLS SkipVerification passes":                                       {query: "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", secret: "app-skip", want: pass},
		"TLS VerifyCA passes":                                               {query: "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", secret: "app-ca", want: pass},
		"TLS VerifyAll passes when the certificate names the pod IP":        {query: "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", secret: "app-all", want: pass},
		"TLS VerifyAll fails when the certificate does not name the pod IP": {secret: "app-all", replica: true, want: fail("TLS: certificate is not valid for 127.0.0.1")},
		"TLS VerifyCA accepts a certificate without the pod IP":             {secret: "app-ca", replica: true, want: pass},
		"TLS with a certificate of another CA fails":                        {secret: "app-other", want: fail("TLS: certificate signed by unknown authority")},
		"TLS Disabled does not use TLS":                                     {query: "SELECT NOT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", secret: "app", want: pass},
		"a client certificate logs in with cert authentication":             {query: "SELECT current_user = 'certuser'", secret: "cert", want: pass},
		"cert authentication without a client certificate fails": {secret: "cert-nokey",
			want: fail(`authentication rejected: connection requires a valid client certificate (SQLSTATE 28000)`)},
		"clear-text password auth without TLS is refused":            {secret: "clear", want: refused("password")},
		"clear-text password auth over unverified TLS is refused":    {secret: "clear-skip", want: refused("password")},
		"clear-text password auth under VerifyCA is refused":         {secret: "clear-ca", want: refusedUnderVerifyCA("password")},
		"clear-text password auth under VerifyAll is allowed":        {secret: "clear-all", want: pass},
		"MD5 auth without TLS is refused":                            {secret: "md5", want: refused("md5")},
		"MD5 auth under VerifyCA is refused":                         {secret: "md5-ca", want: refusedUnderVerifyCA("md5")},
		"MD5 auth under VerifyAll is allowed":                        {query: "SELECT current_user = 'md5user'", secret: "md5-all", want: pass},
		"a query that writes fails and writes nothing":               {query: "INSERT INTO probe_writes VALUES (1) RETURNING true", secret: "app", want: fail("query error: cannot execute INSERT in a read-only transaction (SQLSTATE 25006)")},
		"two statements cannot escape the read-only transaction":     {query: "COMMIT; INSERT INTO probe_writes VALUES (2)", secret: "app", want: fail("query error: cannot insert multiple commands into a prepared statement (SQLSTATE 42601)")},
		"a function cannot switch the transaction to read-write":     {query: "SELECT set_config('transaction_read_only', 'off', true)", secret: "app", want: fail("query error: transaction read-write mode must be set before any query (SQLSTATE 25001)")},
		"the statement timeout is set for the query, not left unset": {query: "SELECT current_setting('statement_timeout') <> '0'", secret: "app", want: pass},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			srv := pg.primary
			if tc.replica {
				srv = pg.replica
			}
			got := probePG(t, secrets, pgProbe(tc.query, tc.db, tc.secret, 5), srv)
			require.Equal(t, tc.want, got)
		})
	}

	// The writing queries wrote nothing, though the role may write: the read-only transaction
	// is what stopped them.
	ctx := t.Context()
	admin, err := pg.primary.Connect(ctx, "")
	require.NoError(t, err)
	defer admin.Close(ctx)
	var rows int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM probe_writes").Scan(&rows))
	require.Zero(t, rows, "a probe query wrote a row")
	_, err = admin.Exec(ctx, "SET ROLE app; INSERT INTO probe_writes VALUES (3); DELETE FROM probe_writes; RESET ROLE")
	require.NoError(t, err, "the role app can write outside the probe")
}

func TestPostgreSQLSlowQueryIsCancelledOnTheServer(t *testing.T) {
	pg := pgServers(t)
	secrets := staticCredentials{"app": pgSecret(map[string]string{"user": "app", "password": appPassword})}
	const timeout = 2
	const query = "SELECT pg_sleep(60) IS NULL"
	ctx := t.Context()
	admin, err := pg.primary.Connect(ctx, "")
	require.NoError(t, err)
	defer admin.Close(ctx)
	running := func() int {
		var n int
		require.NoError(t, admin.QueryRow(ctx,
			"SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND application_name = 'service-with-healthchecks-probe' AND query = $1",
			query).Scan(&n))
		return n
	}

	start := time.Now()
	results := make(chan prober.Result, 1)
	go func() {
		p := prober.New(prober.Options{Credentials: secrets})
		res, err := p.Probe(context.WithoutCancel(ctx), pgProbe(query, "", "app", timeout), "ns", pg.primary.Host, int32(pg.primary.Port))
		assert.NoError(t, err)
		results <- res
	}()
	require.Eventually(t, func() bool { return running() == 1 }, 10*time.Second, 20*time.Millisecond,
		"the probe's query runs on the server")
	res := <-results
	require.Equal(t, prober.Result{Outcome: prober.Failure, Reason: "query cancelled by the server's statement timeout (SQLSTATE 57014)"}, res)
	require.Less(t, time.Since(start), deadlineBound(timeout))
	// pg_sleep does not notice a closed client: only the server's statement timeout stops it.
	require.Eventually(t, func() bool { return running() == 0 }, deadlineBound(timeout), 20*time.Millisecond,
		"the query must not keep running on the server")
}

func TestPostgreSQLPromotionStopAndStart(t *testing.T) {
	ctx := t.Context()
	primary := postgres.StartForTest(t, postgres.Options{})
	require.NoError(t, primary.CreateRole(ctx, "app", appPassword))
	replica := primary.ReplicaForTest(t, postgres.Options{})
	secrets := staticCredentials{"app": pgSecret(map[string]string{"user": "app", "password": appPassword})}
	isPrimary := pgProbe("SELECT NOT pg_is_in_recovery()", "", "app", 5)

	require.Equal(t, prober.Success, probePG(t, secrets, isPrimary, primary).Outcome)
	require.Equal(t, prober.Result{Outcome: prober.Failure, Reason: "query returned false"}, probePG(t, secrets, isPrimary, replica))

	require.NoError(t, replica.Promote(ctx))
	require.Equal(t, prober.Result{Outcome: prober.Success, Reason: "query returned a true value"}, probePG(t, secrets, isPrimary, replica),
		"the promoted replica passes")

	tlsSecrets := staticCredentials{"app": pgSecret(map[string]string{"user": "app", "password": appPassword, "tlsMode": "SkipVerification"})}
	require.Equal(t, prober.Result{Outcome: prober.Failure, Reason: "TLS: server does not accept TLS"}, probePG(t, tlsSecrets, isPrimary, replica),
		"a TLS mode against a server without ssl fails as TLS")

	require.NoError(t, primary.Stop(ctx))
	require.Equal(t, prober.Result{Outcome: prober.Failure, Reason: "connection refused"}, probePG(t, secrets, isPrimary, primary))
	require.NoError(t, primary.Start(ctx))
	require.Equal(t, prober.Success, probePG(t, secrets, isPrimary, primary).Outcome, "a restarted server passes again")
}

// recordingProxy forwards one TCP connection at a time to target and keeps what each side sent.
type recordingProxy struct {
	l          net.Listener
	mu         sync.Mutex
	fromClient []byte
	fromServer []byte
	wg         sync.WaitGroup
	target     string
}

func startProxy(t *testing.T, target string) *recordingProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &recordingProxy{l: l, target: target}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.wg.Add(2)
			go p.pipe(c, s, &p.fromClient)
			go p.pipe(s, c, &p.fromServer)
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		p.wg.Wait()
	})
	return p
}

func (p *recordingProxy) pipe(from, to net.Conn, rec *[]byte) {
	defer p.wg.Done()
	defer to.Close()
	defer from.Close()
	buf := make([]byte, 4096)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			p.mu.Lock()
			*rec = append(*rec, buf[:n]...)
			p.mu.Unlock()
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *recordingProxy) seen() (fromClient, fromServer []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]byte(nil), p.fromClient...), append([]byte(nil), p.fromServer...)
}

func (p *recordingProxy) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fromClient, p.fromServer = nil, nil
}

// cleartextRequest is the server's AuthenticationCleartextPassword message.
var cleartextRequest = func() []byte {
	b := []byte{'R', 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], 8)
	binary.BigEndian.PutUint32(b[5:], 3)
	return b
}()

func TestPostgreSQLNeverSendsAPasswordInClearText(t *testing.T) {
	pg := pgServers(t)
	proxy := startProxy(t, pg.primary.Address())
	proxyAddr := proxy.l.Addr().(*net.TCPAddr)
	secrets := staticCredentials{"clear": pgSecret(map[string]string{"user": "clearuser", "password": clearPassword})}

	// Control: an ordinary client through the same proxy sends the password the server asks
	// for, and the proxy sees it. So the proxy would catch the probe if it did the same.
	cfg, err := pgconn.ParseConfig(fmt.Sprintf("host=127.0.0.1 port=%d user=clearuser dbname=postgres sslmode=disable", proxyAddr.Port))
	require.NoError(t, err)
	cfg.Password = clearPassword
	c, err := pgconn.ConnectConfig(t.Context(), cfg)
	require.NoError(t, err)
	require.NoError(t, c.Close(t.Context()))
	require.Eventually(t, func() bool {
		fromClient, _ := proxy.seen()
		return strings.Contains(string(fromClient), clearPassword)
	}, 10*time.Second, 10*time.Millisecond, "the control client sends the clear-text password")
	proxy.reset()

	logs := &logBuffer{}
	p := prober.New(prober.Options{Credentials: secrets, Logger: logs.logger()})
	res, err := p.Probe(t.Context(), pgProbe("", "", "clear", 5), "ns", "127.0.0.1", int32(proxyAddr.Port))
	require.NoError(t, err)
	require.Equal(t, prober.Failure, res.Outcome)
	require.Contains(t, res.Reason, "refused to authenticate")
	fromClient, fromServer := proxy.seen()
	require.Contains(t, string(fromServer), string(cleartextRequest), "the server asked for the password in clear text")
	require.NotContains(t, string(fromClient), clearPassword, "the probe must not send the password")
	require.NotContains(t, logs.String(), clearPassword)
	require.NotContains(t, res.Reason, clearPassword)
	log, err := pg.primary.Log()
	require.NoError(t, err)
	require.NotContains(t, log, clearPassword)
}

func TestPostgreSQLServerThatNeverAnswersIsCutAtTheDeadline(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- c // Reads nothing, answers nothing: the startup message goes unanswered.
		}
	}()
	secrets := staticCredentials{"app": pgSecret(map[string]string{"user": "app", "password": appPassword})}
	p := prober.New(prober.Options{Credentials: secrets})
	start := time.Now()
	res, err := p.Probe(t.Context(), pgProbe("", "", "app", 1), "ns", "127.0.0.1", port(l))
	elapsed := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, prober.Result{Outcome: prober.Failure, Reason: "timeout after 1s"}, res)
	require.Less(t, elapsed, deadlineBound(1))
	c := <-accepted // The connection was made: the deadline ended the probe.
	_ = c.Close()
}

// loadingCredentials is a store whose Secrets are all still loading.
type loadingCredentials struct{}

func (loadingCredentials) Lookup(namespace, name string) (*credentials.Credentials, error) {
	return nil, fmt.Errorf("credentials Secret %s/%s: not loaded yet: %w", namespace, name, credentials.ErrLoading)
}

// A probe whose credential Secret is still loading is deferred, not failed: the run counts for
// nothing (an agent that has just started does not withdraw anything before it could know).
func TestPostgreSQLWithASecretStillLoadingIsDeferred(t *testing.T) {
	p := prober.New(prober.Options{Credentials: loadingCredentials{}})
	res, err := p.Probe(t.Context(), v1alpha1.Probe{Mode: v1alpha1.ProbeModePostgreSQL, TimeoutSeconds: 1,
		PostgreSQL: &v1alpha1.PostgreSQLProbe{TargetPort: intstr.FromInt32(5432), AuthSecretName: "db"}}, "ns", "127.0.0.1", 5432)
	require.NoError(t, err)
	assert.Equal(t, prober.Deferred, res.Outcome)
	assert.Contains(t, res.Reason, "not loaded yet")
}
