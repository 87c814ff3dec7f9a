// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/credentials"
)

// probePostgreSQL connects to addr with the probe's credentials, runs the query in a read-only
// transaction with a server-side statement timeout, and judges the first value of the first row.
// The connection is closed afterwards (no reuse, see development/PROBES.md). The steps: look
// up the credentials, build the config (pure, pgconfig.go), connect, query, judge.
func (p *Prober) probePostgreSQL(ctx context.Context, pg *v1alpha1.PostgreSQLProbe, namespace string, addr netip.AddrPort, timeout time.Duration) (Result, error) {
	creds, res, ok := p.credentialsOf(namespace, pg.AuthSecretName, wellknown.SecretTypePostgreSQLCredentials)
	if !ok {
		return res, nil
	}
	tmpl, err := pgTemplate()
	if err != nil {
		return Result{}, err
	}
	conn, err := pgconn.ConnectConfig(ctx, pgConfig(tmpl, addr, pgDBName(pg.DBName), creds))
	if err != nil {
		return failure(pgConnectReason(ctx, err, timeout, creds)), nil
	}
	defer closePostgreSQL(ctx, conn)
	return runQuery(ctx, conn, pgQuery(pg.Query), timeout), nil
}

// pgCredentials returns the parsed Secret a probe names (nil when it names none), or, when
// ok is false, the result of the probe without it: a failure that names the problem, or
// Deferred while the Secret is still loading.
func (p *Prober) pgCredentials(namespace, name string) (creds *credentials.Credentials, res Result, ok bool) {
	if name == "" {
		return nil, Result{}, true
	}
	if p.creds == nil {
		return nil, failure(fmt.Sprintf("credentials Secret %s/%s: no credential store", namespace, name)), false
	}
	c, err := p.creds.Lookup(namespace, name)
	if errors.Is(err, credentials.ErrLoading) {
		return nil, Result{Outcome: Deferred, Reason: err.Error()}, false
	}
	if err != nil {
		return nil, failure(err.Error()), false
	}
	return c, Result{}, true
}

// closePostgreSQL terminates the session politely when there is time left; Close always
// closes the socket.
func closePostgreSQL(ctx context.Context, conn *pgconn.PgConn) {
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 100*time.Millisecond)
	defer cancel()
	_ = conn.Close(closeCtx)
}

// runQuery runs query in a read-only transaction (beginReadOnly) and judges its first row.
func runQuery(ctx context.Context, conn *pgconn.PgConn, query string, timeout time.Duration) Result {
	deadline, hasDeadline := ctx.Deadline()
	if err := conn.Exec(ctx, beginReadOnly(time.Until(deadline), hasDeadline)).Close(); err != nil {
		return failure("starting read-only transaction: " + pgQueryReason(ctx, err, timeout))
	}
	// The extended protocol runs exactly one statement, so the query cannot end the read-only
	// transaction and write after it.
	rr := conn.ExecParams(ctx, query, nil, nil, nil, nil)
	// The row's values are valid until Close: the verdict is made before it.
	var verdict Result
	if rr.NextRow() {
		verdict = queryVerdict(true, rr.Values())
	} else {
		verdict = queryVerdict(false, nil)
	}
	if _, err := rr.Close(); err != nil {
		return failure(pgQueryReason(ctx, err, timeout))
	}
	return verdict
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
