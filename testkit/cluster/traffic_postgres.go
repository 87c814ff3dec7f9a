// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"fmt"
	"maps"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/deckhouse/service-with-healthchecks/testkit/postgres"
)

// PostgreSQL is the traffic client's protocol for PostgreSQL servers (testkit/postgres) run in
// pods: each request opens a new connection (so kube-proxy picks an endpoint for every one),
// logs in with TrafficOptions.PostgreSQL, runs PostgreSQLQuery and closes the connection. The
// answer is the server's cluster_name, which PostgreSQLOptions sets to the pod's "namespace/name",
// so every reply names the pod that answered. OK means a completed query with a non-empty
// answer.
const PostgreSQL Protocol = "postgresql"

// PostgreSQLQuery is what the PostgreSQL protocol asks each server.
const PostgreSQLQuery = "SELECT current_setting('cluster_name')"

// PostgreSQLLogin is how the PostgreSQL protocol logs in.
type PostgreSQLLogin struct {
	// User to log in as (default postgres, the harness's superuser).
	User string
	// Password of User; may be empty (trust).
	Password string
	// Database to connect to (default postgres).
	Database string
}

// PostgreSQLOptions returns opts for a testkit/postgres server that runs inside the pod: it
// listens on the pod's address (ListenAddress, CommandPrefix) and its cluster_name is the
// pod's key, which is what the PostgreSQL traffic protocol reports as the answering pod. The
// other fields of opts are kept; opts.Settings is copied, not changed.
//
//	primary := postgres.StartForTest(t, db0.PostgreSQLOptions(postgres.Options{}))
//	replica := primary.ReplicaForTest(t, db1.PostgreSQLOptions(postgres.Options{}))
func (p *Pod) PostgreSQLOptions(opts postgres.Options) postgres.Options {
	opts.ListenAddress = p.IP.String()
	opts.CommandPrefix = p.CommandPrefix()
	settings := map[string]string{}
	maps.Copy(settings, opts.Settings)
	settings["cluster_name"] = "'" + strings.ReplaceAll(p.Key(), "'", "''") + "'"
	opts.Settings = settings
	return opts
}

// requestPostgreSQL is one request of the PostgreSQL protocol.
func requestPostgreSQL(ctx context.Context, target string, login *PostgreSQLLogin, timeout time.Duration, dc DialContext) (pod string, ok bool, errMsg string) {
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		return "", false, err.Error()
	}
	var l PostgreSQLLogin
	if login != nil {
		l = *login
	}
	if l.User == "" {
		l.User = postgres.Superuser
	}
	if l.Database == "" {
		l.Database = "postgres"
	}
	if _, err := strconv.Atoi(port); err != nil {
		return "", false, fmt.Sprintf("port %q: %v", port, err)
	}
	// The values are quoted for the connection string; the password is set on the config.
	cfg, err := pgconn.ParseConfig(fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable application_name=testkit-traffic",
		quoteConnValue(host), port, quoteConnValue(l.User), quoteConnValue(l.Database)))
	if err != nil {
		return "", false, "parsing the connection settings: " + err.Error()
	}
	cfg.Password = l.Password
	cfg.ConnectTimeout = timeout
	cfg.DialFunc = pgconn.DialFunc(dc)
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgconn.ConnectConfig(rctx, cfg)
	if err != nil {
		return "", false, "connecting: " + err.Error()
	}
	defer func() { _ = conn.Close(context.WithoutCancel(rctx)) }()
	results, err := conn.Exec(rctx, PostgreSQLQuery).ReadAll()
	if err != nil {
		return "", false, "query: " + err.Error()
	}
	if len(results) != 1 || len(results[0].Rows) != 1 || len(results[0].Rows[0]) != 1 {
		return "", false, "query: not one value"
	}
	pod = strings.TrimSpace(string(results[0].Rows[0][0]))
	if pod == "" {
		return "", false, "empty cluster_name (start the server with Pod.PostgreSQLOptions)"
	}
	return pod, true, ""
}

func quoteConnValue(v string) string {
	return "'" + strings.ReplaceAll(strings.ReplaceAll(v, `\`, `\\`), "'", `\'`) + "'"
}
