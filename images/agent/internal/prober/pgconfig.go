// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/credentials"
)

// The builders of a PostgreSQL probe: pure functions of the probe's fields, its credentials
// and the pod's address, tested as tables (pgconfig_internal_test.go). What they build is
// used by probePostgreSQL.

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
// per probe (pgConfig). An error (e.g. a PGSERVICE in the environment that names no service)
// makes every PostgreSQL probe return it instead of crashing the agent at start.
var pgTemplate = sync.OnceValues(func() (*pgconn.Config, error) {
	cfg, err := pgconn.ParseConfig("host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable")
	if err != nil {
		return nil, fmt.Errorf("parsing the PostgreSQL template config (check PG* environment variables): %w", err)
	}
	return cfg, nil
})

// pgQuery is the probe's query, or the default one when it is blank.
func pgQuery(query string) string {
	if strings.TrimSpace(query) == "" {
		return v1alpha1.DefaultPostgreSQLQuery
	}
	return query
}

// pgDBName is the probe's database, or the default one.
func pgDBName(dbName string) string {
	if dbName == "" {
		return v1alpha1.DefaultPostgreSQLDBName
	}
	return dbName
}

// pgConfig builds the connection config of a probe from a copy of tmpl (made by
// pgconn.ParseConfig): the pod's address as the only one ever dialled, through the per-probe
// read bound; the database; the role and password of creds (nil: the default role, no
// password, no TLS); the TLS setup of creds' tlsMode (credentialsTLSConfig, tls.go); SCRAM required unless TLS
// proves which server answers (VerifyAll); a bound on each backend message. Nothing of tmpl
// that could dial elsewhere, retry or run a hook is kept.
func pgConfig(tmpl *pgconn.Config, addr netip.AddrPort, dbName string, creds *credentials.Credentials) *pgconn.Config {
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
		cfg.TLSConfig = credentialsTLSConfig(creds, addr.Addr())
	}
	return cfg
}

// beginReadOnly is the statement that opens the probe's transaction: read-only, with a
// server-side statement timeout of nine tenths of the time left (remaining, when hasDeadline),
// at least 1 ms, and 1 s without a deadline. The server then cancels a slow query rather than
// leaving it running after the probe hangs up, and its error, not a client timeout, is what
// the probe reports.
func beginReadOnly(remaining time.Duration, hasDeadline bool) string {
	stmtTimeout := time.Second
	if hasDeadline {
		stmtTimeout = remaining * 9 / 10
	}
	stmtTimeout = max(stmtTimeout, time.Millisecond)
	return "BEGIN READ ONLY; SET LOCAL statement_timeout = " + strconv.FormatInt(stmtTimeout.Milliseconds(), 10)
}

// queryVerdict judges a query's result: gotRow says whether it returned a row, values are
// that row's. The first value must be there, not NULL and not false-like (falseLike).
func queryVerdict(gotRow bool, values [][]byte) Result {
	switch {
	case !gotRow:
		return failure("query returned no rows")
	case len(values) == 0:
		return failure("query returned no columns")
	case values[0] == nil:
		return failure("query returned NULL")
	}
	value := strings.TrimSpace(string(values[0]))
	if !falseLike(value) {
		return success("query returned a true value")
	}
	if strings.EqualFold(value, "f") || strings.EqualFold(value, "false") {
		return failure("query returned false")
	}
	return failure("query returned false (" + value + ")")
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
