// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/mariadb"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

// The MySQL part of the demo: resources mysql-db-read and mysql-db-write (docs/examples/mysql.yaml,
// with the probe's Secret docs/examples/mysql-credentials.yaml) over the pods mysql-0 (node-a)
// and mysql-1 (node-b), a real MariaDB primary and its replica (testkit/mariadb, development/RUN.md).
var mysqlFiles = []string{"docs/examples/mysql-credentials.yaml", "docs/examples/mysql.yaml"}

const (
	mysqlPort = 3306
	// mysqlApp is the account the MySQL traffic loops log in as (the probe uses the example
	// Secret's).
	mysqlApp         = "app"
	mysqlAppPassword = "app-password"
)

// startMySQL adds the pods, starts the primary in mysql-0 and a replica in mysql-1 (read_only,
// replicating for real), and creates on each, outside the binary log, the probe's account of the
// example Secret (no rights, as docs/EXAMPLES.md says) and the traffic's.
func (d *demo) startMySQL(ctx context.Context) (string, error) {
	user, password, err := mysqlCredentials()
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(mariadb.Daemon); err != nil {
		return "", fmt.Errorf("MariaDB is missing (%s): run `make deps` (as root)", mariadb.Daemon)
	}
	for i := range d.mysqlPods {
		d.mysqlPods[i], err = d.c.NewPod(ctx, cluster.PodSpec{
			Namespace: demoNamespace, Name: fmt.Sprintf("mysql-%d", i), Node: d.c.Nodes[i%len(d.c.Nodes)].Name,
			Labels:         map[string]string{"app": "mysql"},
			ContainerPorts: []corev1.ContainerPort{{Name: "mysql", ContainerPort: mysqlPort, Protocol: corev1.ProtocolTCP}},
		})
		if err != nil {
			return "", err
		}
	}
	for i, p := range d.mysqlPods {
		if d.mysql[i], err = mariadb.Start(ctx, p.MariaDBOptions(mariadb.Options{ServerID: i + 1})); err != nil {
			return "", err
		}
	}
	if err := d.mysql[1].ReplicateFrom(ctx, d.mysql[0]); err != nil {
		return "", err
	}
	for _, srv := range d.mysql {
		if err := srv.Exec(ctx, fmt.Sprintf("SET sql_log_bin = 0; CREATE USER %s@'%%' IDENTIFIED BY %s; "+
			"CREATE USER %s@'%%' IDENTIFIED BY %s", sqlQuote(user), sqlQuote(password), sqlQuote(mysqlApp), sqlQuote(mysqlAppPassword))); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("MariaDB: primary in %s (%s), replica in %s (%s)",
		d.mysqlPods[0].Name, d.mysqlPods[0].Node, d.mysqlPods[1].Name, d.mysqlPods[1].Node), nil
}

// mysqlFailover promotes the replica and makes the old primary its read_only replica: the
// roles swap, every time the command runs.
func (d *demo) mysqlFailover(ctx context.Context) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mysql[0] == nil || d.mysql[1] == nil {
		return "", errors.New("the demo has no MariaDB servers")
	}
	oldP, newP := d.mysqlPrimary, 1-d.mysqlPrimary
	if err := d.mysql[newP].Promote(ctx); err != nil {
		return "", err
	}
	if err := d.mysql[oldP].ReplicateFrom(ctx, d.mysql[newP]); err != nil {
		return "", err
	}
	d.mysqlPrimary = newP
	return fmt.Sprintf("%s is the primary (writable); %s replicates from it (read_only=1)", d.mysqlPods[newP].Name, d.mysqlPods[oldP].Name), nil
}

// mysqlCredentials are the user and password of docs/examples/mysql-credentials.yaml.
func mysqlCredentials() (user, password string, err error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", "", err
	}
	data, err := os.ReadFile(filepath.Join(root, mysqlFiles[0]))
	if err != nil {
		return "", "", fmt.Errorf("reading the example MySQL credentials: %w", err)
	}
	objs, err := stack.DecodeYAML(data)
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", mysqlFiles[0], err)
	}
	if len(objs) != 1 || objs[0].GetKind() != "Secret" || objs[0].Object["type"] != wellknown.SecretTypeMySQLCredentials {
		return "", "", fmt.Errorf("%s: want one Secret of type %s", mysqlFiles[0], wellknown.SecretTypeMySQLCredentials)
	}
	sd := stringMap(objs[0].Object, "stringData")
	if sd["user"] == "" || sd["password"] == "" {
		return "", "", fmt.Errorf("%s: stringData.user and stringData.password must be set", mysqlFiles[0])
	}
	return sd["user"], sd["password"], nil
}

// sqlQuote is a MariaDB string literal.
func sqlQuote(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
