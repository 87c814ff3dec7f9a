// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"context"
	"crypto/tls"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/credentials"
)

// The MySQL error numbers the reasons tell apart.
const (
	mysqlErrDBAccessDenied     = 1044 // ER_DBACCESS_DENIED_ERROR
	mysqlErrAccessDenied       = 1045 // ER_ACCESS_DENIED_ERROR
	mysqlErrParse              = 1064 // ER_PARSE_ERROR
	mysqlErrAccessDeniedNoPass = 1698 // ER_ACCESS_DENIED_NO_PASSWORD_ERROR
	mysqlErrStatementTimeout   = 1969 // MariaDB's ER_STATEMENT_TIMEOUT
	mysqlErrExecutionTime      = 3024 // MySQL's ER_QUERY_TIMEOUT (max_execution_time)
)

// probeMySQL connects to addr with the probe's credentials (one connection, no pool: the
// driver's Connector, without database/sql), runs the query in a read-only transaction and
// judges the first column of the first row (mysqlVerdict). The connection is closed afterwards.
// The deadline is ctx's (the driver closes the socket when it passes) and, per read and write,
// the driver's ReadTimeout and WriteTimeout.
func (p *Prober) probeMySQL(ctx context.Context, my *v1alpha1.MySQLProbe, namespace string, addr netip.AddrPort, timeout time.Duration) (Result, error) {
	creds, res, ok := p.credentialsOf(namespace, my.AuthSecretName, wellknown.SecretTypeMySQLCredentials)
	if !ok {
		return res, nil
	}
	var pc *mysqlPacketConn
	var realTLS *tls.Config
	cfg := mysqlConfig(addr, my.DBName, creds, timeout, func(ctx context.Context, _, _ string) (net.Conn, error) {
		// Only ever dial the pod, whatever address the driver asks for.
		c, err := dial(ctx, addr)
		if err != nil {
			return nil, err
		}
		pc = newMySQLPacketConn(newLimitedConn(c), realTLS)
		return pc, nil
	})
	if cfg.TLS != nil {
		// The TLS to the pod is the relay's (mysqltls.go); the driver's trusts the relay only.
		_, relayClient, err := relayConfigs()
		if err != nil {
			return Result{}, err
		}
		realTLS, cfg.TLS = cfg.TLS, relayClient
	}
	defer func() {
		// The driver closes what it dialled; a relay that outlived a failed connect goes too.
		if pc != nil {
			_ = pc.Close()
		}
	}()
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return Result{}, fmt.Errorf("MySQL config: %w", err)
	}
	conn, err := connector.Connect(ctx)
	if err != nil {
		return failure(mysqlConnectReason(ctx, err, pc, timeout, creds != nil)), nil
	}
	defer func() { _ = conn.Close() }()
	return mysqlRunQuery(ctx, conn, mysqlQuery(my.Query), pc, timeout), nil
}

// credentialsOf is pgCredentials for a Secret that must be of type want: a Secret of the other
// credential type fails the probe with a reason that names both.
func (p *Prober) credentialsOf(namespace, name, want string) (*credentials.Credentials, Result, bool) {
	creds, res, ok := p.pgCredentials(namespace, name)
	if ok && creds != nil && creds.Type != want {
		return nil, failure(fmt.Sprintf("credentials Secret %s/%s has type %s, this probe needs %s", namespace, name, creds.Type, want)), false
	}
	return creds, res, ok
}

// mysqlRunQuery opens a read-only transaction (a server too old for one, which refuses the
// syntax, runs the query without), runs query alone (the driver never enables multi-statements)
// and judges its first row.
func mysqlRunQuery(ctx context.Context, conn driver.Conn, query string, pc *mysqlPacketConn, timeout time.Duration) Result {
	beginner, ok1 := conn.(driver.ConnBeginTx)
	queryer, ok2 := conn.(driver.QueryerContext)
	if !ok1 || !ok2 {
		return failure("MySQL driver without transactions or queries")
	}
	if _, err := beginner.BeginTx(ctx, driver.TxOptions{ReadOnly: true}); err != nil && !isMySQLError(err, mysqlErrParse) {
		return failure("starting read-only transaction: " + mysqlQueryReason(ctx, err, pc, timeout))
	}
	rows, err := queryer.QueryContext(ctx, query, nil)
	if err != nil {
		return failure(mysqlQueryReason(ctx, err, pc, timeout))
	}
	dest := make([]driver.Value, len(rows.Columns()))
	if len(dest) == 0 {
		_ = rows.Close()
		return failure("query returned no columns")
	}
	err = rows.Next(dest)
	if err != nil && !errors.Is(err, io.EOF) {
		_ = rows.Close()
		return failure(mysqlQueryReason(ctx, err, pc, timeout))
	}
	verdict := mysqlVerdict(err == nil, dest[0])
	// Close reads the rest of the result, within the probe's read bound.
	if err := rows.Close(); err != nil {
		return failure(mysqlQueryReason(ctx, err, pc, timeout))
	}
	return verdict
}

// mysqlConnectReason classifies a failed connection: the server's refusal (access denied names
// the account), a bound, TLS, an authentication method the probe does not allow, the network.
func mysqlConnectReason(ctx context.Context, err error, pc *mysqlPacketConn, timeout time.Duration, hasCreds bool) string {
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		switch myErr.Number {
		case mysqlErrAccessDenied, mysqlErrAccessDeniedNoPass, mysqlErrDBAccessDenied:
			return mysqlAuthReason(myErr, hasCreds)
		}
		return mysqlServerError(myErr)
	}
	switch {
	case errors.Is(err, mysql.ErrNoTLS):
		return "TLS: server does not accept TLS"
	case errors.Is(err, mysql.ErrCleartextPassword):
		return "refused to authenticate: server asked for a clear-text password, which needs tlsMode VerifyAll"
	case errors.Is(err, mysql.ErrOldPassword), errors.Is(err, mysql.ErrNativePassword):
		return "refused to authenticate: server asked for an authentication method the probe does not use (" + err.Error() + ")"
	}
	if reason, ok := certificateReason(err); ok {
		return reason
	}
	var recordHeader tls.RecordHeaderError
	if errors.As(err, &recordHeader) || strings.HasPrefix(err.Error(), "tls: ") {
		return tlsReason(ctx, err, timeout)
	}
	// The TLS to the pod is the relay's: its handshake error is the connection's first.
	if pc != nil {
		if connErr := pc.firstError(); connErr != nil {
			if reason, ok := certificateReason(connErr); ok {
				return reason
			}
			if errors.As(connErr, &recordHeader) || strings.HasPrefix(connErr.Error(), "tls: ") {
				return tlsReason(ctx, connErr, timeout)
			}
		}
	}
	return mysqlNetReason(ctx, err, pc, timeout)
}

// mysqlQueryReason classifies a failed statement.
func mysqlQueryReason(ctx context.Context, err error, pc *mysqlPacketConn, timeout time.Duration) string {
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		if myErr.Number == mysqlErrStatementTimeout || myErr.Number == mysqlErrExecutionTime {
			return "query cancelled by the server's statement timeout: " + mysqlServerError(myErr)
		}
		return "query error: " + mysqlServerError(myErr)
	}
	return "query: " + mysqlNetReason(ctx, err, pc, timeout)
}

// mysqlNetReason names what ended the connection: a read bound, the deadline, the first
// network error the connection met (the driver reports most as "invalid connection"), or the
// driver's own error.
func mysqlNetReason(ctx context.Context, err error, pc *mysqlPacketConn, timeout time.Duration) string {
	var connErr error
	if pc != nil {
		connErr = pc.firstError()
	}
	if reason, ok := limitReason(connErr); ok {
		return reason
	}
	if reason, ok := limitReason(err); ok {
		return reason
	}
	if ctx.Err() != nil {
		return netReason(ctx, ctx.Err(), timeout)
	}
	switch {
	case errors.Is(connErr, io.EOF), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "server closed the connection"
	case connErr != nil:
		return netReason(ctx, connErr, timeout)
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) || isTimeout(err) {
		return netReason(ctx, err, timeout)
	}
	return "MySQL protocol: " + serverText(err.Error(), maxServerTextBytes)
}

// isMySQLError reports whether err is the server's error number.
func isMySQLError(err error, number uint16) bool {
	var myErr *mysql.MySQLError
	return errors.As(err, &myErr) && myErr.Number == number
}
