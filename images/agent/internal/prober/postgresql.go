// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/credentials"
)

// defaultPostgreSQLUser is the role used when a probe names no credential Secret.
const defaultPostgreSQLUser = "postgres"

// applicationName is shown in pg_stat_activity for the probe's sessions.
const applicationName = "service-with-healthchecks-probe"

// requireSCRAM is the authentication policy unless TLS proves which server answers (tlsMode
// VerifyAll): only SCRAM (which never reveals the password) or no password exchange at all
// (trust, certificates). A server asking for a clear-text or MD5 password is refused before
// anything is sent.
const requireSCRAM = "scram-sha-256,none"

// pgTemplate is parsed once: pgconn.ConnectConfig only takes configs made by ParseConfig, and
// parsing reads the environment and the password file. Every field that matters is set again
// per probe. An error (e.g. a PGSERVICE in the environment that names no service) makes every
// PostgreSQL probe return it instead of crashing the agent at start.
var pgTemplate = sync.OnceValues(func() (*pgconn.Config, error) {
	cfg, err := pgconn.ParseConfig("host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable")
	if err != nil {
		return nil, fmt.Errorf("parsing the PostgreSQL template config (check PG* environment variables): %w", err)
	}
	return cfg, nil
})

// probePostgreSQL connects to addr with the probe's credentials, runs the query in a read-only
// transaction with a server-side statement timeout, and judges the first value of the first row.
// The connection is closed afterwards (no reuse, see development/PROBES.md).
func (p *Prober) probePostgreSQL(ctx context.Context, pg *v1alpha1.PostgreSQLProbe, namespace string, addr netip.AddrPort, timeout time.Duration) (Result, error) {
	query := pg.Query
	if strings.TrimSpace(query) == "" {
		query = v1alpha1.DefaultPostgreSQLQuery
	}
	dbName := pg.DBName
	if dbName == "" {
		dbName = v1alpha1.DefaultPostgreSQLDBName
	}
	var creds *credentials.Credentials
	if pg.AuthSecretName != "" {
		if p.creds == nil {
			return failure(fmt.Sprintf("credentials Secret %s/%s: no credential store", namespace, pg.AuthSecretName)), nil
		}
		c, err := p.creds.Lookup(namespace, pg.AuthSecretName)
		if errors.Is(err, credentials.ErrLoading) {
			return Result{Outcome: Deferred, Reason: err.Error()}, nil
		}
		if err != nil {
			return failure(err.Error()), nil
		}
		creds = c
	}

	tmpl, err := pgTemplate()
	if err != nil {
		return Result{}, err
	}
	cfg := tmpl.Copy()
	cfg.Host = addr.Addr().String()
	cfg.Port = addr.Port()
	cfg.Database = dbName
	cfg.User = defaultPostgreSQLUser
	cfg.Password = ""
	cfg.ConnectTimeout = 0 // ctx carries the deadline.
	cfg.Fallbacks = nil
	cfg.ValidateConnect = nil
	cfg.AfterConnect = nil
	cfg.RuntimeParams = map[string]string{"application_name": applicationName}
	cfg.RequireAuth = requireSCRAM
	cfg.TLSConfig = nil
	cfg.SSLNegotiation = ""
	// pgproto3 allocates the length a message declares before reading it (1 GiB by default).
	cfg.MaxProtocolMessageBodyLen = maxPostgreSQLMessageBytes
	// Only ever dial the pod: ignore whatever address pgconn asks for. Everything pgconn reads
	// (TLS included) goes through the per-probe bound.
	cfg.DialFunc = func(ctx context.Context, _, _ string) (net.Conn, error) {
		c, err := dial(ctx, addr)
		if err != nil {
			return nil, err
		}
		return newLimitedConn(c), nil
	}
	cfg.LookupFunc = func(context.Context, string) ([]string, error) { return []string{addr.Addr().String()}, nil }
	if creds != nil {
		cfg.User = creds.User
		cfg.Password = creds.Password()
		if creds.VerifiesServer() {
			// The server proved who it is: any password method may be used.
			cfg.RequireAuth = ""
		}
		cfg.TLSConfig = pgTLSConfig(creds, addr)
	}

	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return failure(pgConnectReason(ctx, err, timeout, creds)), nil
	}
	defer func() {
		// Terminate politely when there is time left; Close always closes the socket.
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 100*time.Millisecond)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()

	// The server enforces the deadline too, so a slow query is cancelled on the server rather
	// than left running after we hang up. It fires a little before our own deadline so its
	// error, not a client timeout, is what we report.
	stmtTimeout := time.Second
	if deadline, ok := ctx.Deadline(); ok {
		stmtTimeout = time.Until(deadline) * 9 / 10
	}
	stmtTimeout = max(stmtTimeout, time.Millisecond)
	begin := "BEGIN READ ONLY; SET LOCAL statement_timeout = " + strconv.FormatInt(stmtTimeout.Milliseconds(), 10)
	if err := conn.Exec(ctx, begin).Close(); err != nil {
		return failure("starting read-only transaction: " + pgQueryReason(ctx, err, timeout)), nil
	}
	// The extended protocol runs exactly one statement, so the query cannot end the read-only
	// transaction and write after it.
	rr := conn.ExecParams(ctx, query, nil, nil, nil, nil)
	var (
		gotRow  bool
		isNull  bool
		noField bool
		value   string
	)
	if rr.NextRow() {
		gotRow = true
		vals := rr.Values()
		switch {
		case len(vals) == 0:
			noField = true
		case vals[0] == nil:
			isNull = true
		default:
			value = string(vals[0])
		}
	}
	if _, err := rr.Close(); err != nil {
		return failure(pgQueryReason(ctx, err, timeout)), nil
	}
	switch {
	case !gotRow:
		return failure("query returned no rows"), nil
	case noField:
		return failure("query returned no columns"), nil
	case isNull:
		return failure("query returned NULL"), nil
	}
	if falseLike(value) {
		v := strings.TrimSpace(value)
		if strings.EqualFold(v, "f") || strings.EqualFold(v, "false") {
			return failure("query returned false"), nil
		}
		return failure("query returned false (" + v + ")"), nil
	}
	return success("query returned a true value"), nil
}

// falseLike reports the values that fail a query: f, false, 0, no, off (any case).
func falseLike(v string) bool {
	v = strings.TrimSpace(v)
	for _, f := range [...]string{"f", "false", "0", "no", "off"} {
		if strings.EqualFold(v, f) {
			return true
		}
	}
	return false
}

// pgTLSConfig builds the TLS setup of a tlsMode; nil for Disabled.
func pgTLSConfig(c *credentials.Credentials, addr netip.AddrPort) *tls.Config {
	var cfg *tls.Config
	switch c.TLSMode {
	case credentials.TLSSkipVerification:
		cfg = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // The Secret asks for it.
	case credentials.TLSVerifyCA:
		// Verify the chain, not the name (libpq's verify-ca).
		roots := c.RootCAs
		cfg = &tls.Config{
			InsecureSkipVerify: true, //nolint:gosec // Verified below.
			VerifyConnection: func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) == 0 {
					return errors.New("server sent no certificate")
				}
				inter := x509.NewCertPool()
				for _, ic := range cs.PeerCertificates[1:] {
					inter.AddCert(ic)
				}
				_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter})
				return err
			},
		}
	case credentials.TLSVerifyAll:
		// The certificate must chain to caCert and name the pod IP (an IP SAN): the probe dials
		// the IP, so the IP is the identity it can check.
		cfg = &tls.Config{RootCAs: c.RootCAs, ServerName: addr.Addr().String()}
	default:
		return nil
	}
	cfg.MinVersion = tls.VersionTLS12
	if c.ClientCertificate != nil {
		cfg.Certificates = []tls.Certificate{*c.ClientCertificate}
	}
	return cfg
}

// pgConnectReason classifies a failed connection; creds is nil when the probe names no Secret.
func pgConnectReason(ctx context.Context, err error, timeout time.Duration, creds *credentials.Credentials) string {
	if reason, ok := pgLimitReason(err); ok {
		return reason
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "28P01":
			if creds == nil {
				return "authentication failed: the server wants a password, set postgreSQL.authSecretName" + sqlState(pgErr)
			}
			return "authentication failed (wrong user or password)" + sqlState(pgErr)
		case "28000":
			return "authentication rejected: " + pgMessage(pgErr)
		case "3D000", "57P03", "53300":
			// database "x" does not exist; the database system is starting up; too many clients.
			return pgMessage(pgErr)
		}
		return "connection error: " + pgMessage(pgErr)
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "require_auth check failed"):
		method := "a password"
		if i := strings.Index(msg, "server requested "); i >= 0 {
			method = strings.TrimSuffix(msg[i+len("server requested "):], " authentication")
		}
		if creds != nil && creds.TLSMode == credentials.TLSVerifyCA {
			return "refused to authenticate: server asked for " + method + " authentication; tlsMode VerifyCA does not prove which server answers, " +
				"so only SCRAM is allowed (use VerifyAll with the pod IP in the certificate, or SCRAM on the server)"
		}
		return "refused to authenticate: server asked for " + method + " authentication, which needs tlsMode VerifyAll (SCRAM is required otherwise)"
	case strings.Contains(msg, "server refused TLS connection"):
		return "TLS: server does not accept TLS"
	}
	if reason, ok := certificateReason(err); ok {
		return reason
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) || errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return netReason(ctx, err, timeout)
	}
	return "connecting: " + netReason(ctx, err, timeout)
}

// pgQueryReason classifies a failed statement.
func pgQueryReason(ctx context.Context, err error, timeout time.Duration) string {
	if reason, ok := pgLimitReason(err); ok {
		return reason
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if pgErr.Code == "57014" {
			return "query cancelled by the server's statement timeout" + sqlState(pgErr)
		}
		return "query error: " + pgMessage(pgErr)
	}
	return "query: " + netReason(ctx, err, timeout)
}

// pgLimitReason names the read bound that ended a PostgreSQL probe, if one did.
func pgLimitReason(err error) (string, bool) {
	var tooLong *pgproto3.ExceededMaxBodyLenErr
	if errors.As(err, &tooLong) {
		return "server sent a message of " + strconv.Itoa(tooLong.ActualBodyLen) + " bytes, over " +
			byteSize(maxPostgreSQLMessageBytes) + " (the prober's limit per PostgreSQL message)", true
	}
	return limitReason(err)
}

// pgMessage is how a server error appears in a reason: its message, cut to maxServerTextBytes,
// and its SQLSTATE. Both come from the server, so both are cleaned and bounded.
func pgMessage(e *pgconn.PgError) string {
	return serverText(e.Message, maxServerTextBytes) + sqlState(e)
}

// sqlState is " (SQLSTATE xxxxx)". A code is five digits or upper-case letters; other
// characters are dropped and the rest is cut to five.
func sqlState(e *pgconn.PgError) string {
	code := make([]byte, 0, 5)
	for i := 0; i < len(e.Code) && len(code) < 5; i++ {
		if c := e.Code[i]; c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' {
			code = append(code, c)
		}
	}
	return " (SQLSTATE " + string(code) + ")"
}
