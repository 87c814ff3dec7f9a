// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"maps"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/deckhouse/service-with-healthchecks/testkit/mariadb"
)

// MySQL is the traffic client's protocol for MariaDB servers (testkit/mariadb) run in pods: each
// request opens a new connection (so kube-proxy picks an endpoint for every one), logs in with
// TrafficOptions.MySQL, runs MySQLQuery and closes the connection. The answer is the server's
// report_host, which MariaDBOptions sets to the pod's "namespace/name", so every reply names the
// pod that answered. OK means a completed query with a non-empty answer.
const MySQL Protocol = "mysql"

// MySQLQuery is what the MySQL protocol asks each server.
const MySQLQuery = "SELECT @@report_host"

// MySQLLogin is how the MySQL protocol logs in.
type MySQLLogin struct {
	User, Password string
}

// MariaDBOptions returns opts for a testkit/mariadb server that runs inside the pod: it listens
// on the pod's address and its report_host is the pod's key, which the MySQL traffic protocol
// reports as the answering pod. opts.Settings is copied, not changed.
func (p *Pod) MariaDBOptions(opts mariadb.Options) mariadb.Options {
	opts.ListenAddress = p.IP.String()
	opts.CommandPrefix = p.CommandPrefix()
	settings := map[string]string{}
	maps.Copy(settings, opts.Settings)
	settings["report-host"] = p.Key()
	opts.Settings = settings
	return opts
}

// requestMySQL is one request of the MySQL protocol.
func requestMySQL(ctx context.Context, target string, login *MySQLLogin, timeout time.Duration, dc DialContext) (pod string, ok bool, errMsg string) {
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.User = "tcp", target, "root"
	if login != nil {
		cfg.User, cfg.Passwd = login.User, login.Password
	}
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = timeout, timeout, timeout
	cfg.Logger = &mysql.NopLogger{}
	cfg.DialFunc = dc
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return "", false, err.Error()
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := connector.Connect(ctx)
	if err != nil {
		return "", false, err.Error()
	}
	defer func() { _ = conn.Close() }()
	rows, err := conn.(driver.QueryerContext).QueryContext(ctx, MySQLQuery, nil)
	if err != nil {
		return "", false, err.Error()
	}
	defer func() { _ = rows.Close() }()
	dest := make([]driver.Value, 1)
	if err := rows.Next(dest); err != nil {
		if errors.Is(err, io.EOF) {
			return "", false, "no row"
		}
		return "", false, err.Error()
	}
	b, _ := dest[0].([]byte)
	if len(b) == 0 {
		return "", false, "empty report_host"
	}
	return string(b), true, ""
}
