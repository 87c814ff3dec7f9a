// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package mysql_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/mariadb"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

const (
	// examplesSection is the heading of docs/EXAMPLES.md whose SQL and YAML the tests apply.
	examplesSection = "## db-read and db-write over MySQL or MariaDB"
	servicePort     = 3306
	minRequests     = 10
	interval        = 20 * time.Millisecond
	loopLimit       = 5 * time.Minute
	waitFor         = 2 * time.Minute
)

var (
	dbLabels = map[string]string{"app": "mysql"}
	dbPorts  = []corev1.ContainerPort{{Name: "mysql", ContainerPort: servicePort, Protocol: corev1.ProtocolTCP}}
)

// databases is one test's world: a namespace, a primary in db-0 on node-a, a replica in db-1.
type databases struct {
	ns               string
	db0, db1         *cluster.Pod
	primary, replica *mariadb.Server
	login            *cluster.MySQLLogin
	yaml             []byte
}

// startDatabases starts the servers in their pods, replication from db-0 to db-1, runs the
// example's SQL on both (with the binary log off: each server gets the probe's account once),
// applies the example YAML and waits until kube-proxy routes mysql-db-write to the primary and
// mysql-db-read to both.
func startDatabases(t *testing.T, s *stack.Stack) *databases {
	t.Helper()
	c := s.Cluster
	sqlStmts, yaml, login := loadExamples(t)
	d := &databases{ns: c.Env.CreateNamespaceForTest(t, "my"), login: login, yaml: yaml}
	d.db0 = c.AddPod(t, cluster.PodSpec{Namespace: d.ns, Name: "db-0", Node: "node-a", Labels: dbLabels, ContainerPorts: dbPorts})
	d.db1 = c.AddPod(t, cluster.PodSpec{Namespace: d.ns, Name: "db-1", Node: "node-b", Labels: dbLabels, ContainerPorts: dbPorts})
	d.primary = mariadb.StartForTest(t, d.db0.MariaDBOptions(mariadb.Options{ServerID: 1}))
	d.replica = mariadb.StartForTest(t, d.db1.MariaDBOptions(mariadb.Options{ServerID: 2}))
	require.NoError(t, d.replica.ReplicateFrom(t.Context(), d.primary))
	for _, srv := range []*mariadb.Server{d.primary, d.replica} {
		for _, stmt := range sqlStmts {
			require.NoError(t, srv.Exec(t.Context(), "SET sql_log_bin = 0; "+stmt))
		}
	}
	require.NoError(t, s.ApplyYAML(t.Context(), d.ns, yaml))
	c.WaitProgrammed(t, d.ns+"/mysql-db-write", servicePort, d.db0)
	c.WaitProgrammed(t, d.ns+"/mysql-db-read", servicePort, d.db0, d.db1)
	return d
}

// TestMySQLFailoverMovesDBWriteAndNoReadFails: db-write follows the writable server across a
// failover, and a read loop through db-read that spans it has no failed request.
func TestMySQLFailoverMovesDBWriteAndNoReadFails(t *testing.T) {
	s := testStack(t)
	c := s.Cluster
	d := startDatabases(t, s)
	reads := c.Traffic(t, cluster.TrafficOptions{Service: d.ns + "/mysql-db-read", Port: servicePort, Protocol: cluster.MySQL,
		MySQL: d.login, Interval: interval, Duration: loopLimit})
	writes := c.Traffic(t, cluster.TrafficOptions{Service: d.ns + "/mysql-db-write", Port: servicePort, Protocol: cluster.MySQL,
		MySQL: d.login, Interval: interval, Duration: loopLimit})
	waitRequests(t, reads, time.Time{}, 2*minRequests)
	waitRequests(t, writes, time.Time{}, minRequests)

	failover := time.Now()
	require.NoError(t, d.replica.Promote(t.Context()))
	require.NoError(t, d.primary.SetReadOnly(t.Context(), true))
	routed := waitRouted(t, c, d.ns+"/mysql-db-write", d.db1)
	waitRequests(t, writes, routed, minRequests)
	waitRequests(t, reads, routed, minRequests)
	readRes, writeRes := reads.Stop(), writes.Stop()

	before := finishedBefore(writeRes, failover)
	require.GreaterOrEqual(t, len(before), minRequests)
	assert.Equal(t, map[string]int{d.db0.Key(): len(before)}, before.ByPod(), "before the failover db-write reaches the primary: %s", before)
	after := writeRes.Since(routed)
	assert.Equal(t, map[string]int{d.db1.Key(): len(after)}, after.ByPod(), "after it db-write reaches only the new primary: %s", after)
	assert.Empty(t, readRes.Failed(), "no read through db-read fails across the failover: %s", readRes)
	assert.Equal(t, []string{d.db0.Key(), d.db1.Key()}, readRes.Pods(), "db-read balances over both servers: %s", readRes)
	t.Logf("db-write switched %v after the failover began; %d reads, none failed", routed.Sub(failover).Round(time.Millisecond), len(readRes))
}

// TestMySQLWrongPasswordAndUnreachableServerGiveClearReasons: the Events of the resources name a
// wrong password (access denied) and a stopped server (connection refused).
func TestMySQLWrongPasswordAndUnreachableServerGiveClearReasons(t *testing.T) {
	s := testStack(t)
	c := s.Cluster
	d := startDatabases(t, s)
	require.NoError(t, d.replica.Stop(t.Context()))
	waitEvent(t, c, d.ns, "mysql-db-read", "connection refused")

	wrong := bytes.Replace(d.yaml, []byte("password: "+d.login.Password), []byte("password: not-"+d.login.Password), 1)
	require.NotEqual(t, d.yaml, wrong)
	require.NoError(t, s.ApplyYAML(t.Context(), d.ns, wrong))
	waitEvent(t, c, d.ns, "mysql-db-write", "access denied for user '"+d.login.User+"'@")
}

// waitEvent waits for an Event about the resource whose note contains text.
func waitEvent(t *testing.T, c *cluster.Cluster, ns, name, text string) {
	t.Helper()
	var notes []string
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		var events eventsv1.EventList
		require.NoError(ct, c.Env.Client.List(context.WithoutCancel(t.Context()), &events, client.InNamespace(ns)))
		notes = notes[:0]
		found := false
		for _, e := range events.Items {
			if e.Regarding.Name != name {
				continue
			}
			notes = append(notes, e.Reason+": "+e.Note)
			found = found || strings.Contains(e.Note, text)
		}
		assert.True(ct, found, "an Event of %s says %q", name, text)
	}, waitFor, 100*time.Millisecond, "Events of %s/%s: %v", ns, name, notes)
}

// loadExamples reads the SQL and YAML blocks of the MySQL section of docs/EXAMPLES.md and the
// Secret's login.
func loadExamples(t *testing.T) ([]string, []byte, *cluster.MySQLLogin) {
	t.Helper()
	root, err := controlplane.RepoRoot()
	require.NoError(t, err)
	md, err := os.ReadFile(filepath.Join(root, "docs", "EXAMPLES.md"))
	require.NoError(t, err)
	var sqlStmts []string
	var docs [][]byte
	for _, b := range sectionBlocks(t, md, examplesSection) {
		switch b.lang {
		case "sql":
			for stmt := range strings.SplitSeq(b.text, ";") {
				if stmt = strings.TrimSpace(stmt); stmt != "" {
					sqlStmts = append(sqlStmts, stmt)
				}
			}
		case "yaml":
			docs = append(docs, []byte(b.text))
		}
	}
	yaml := bytes.Join(docs, []byte("\n---\n"))
	objs, err := stack.DecodeYAML(yaml)
	require.NoError(t, err)
	var login *cluster.MySQLLogin
	var kinds []string
	for _, u := range objs {
		kinds = append(kinds, u.GetKind()+"/"+u.GetName())
		if u.GetKind() == "Secret" {
			var secret corev1.Secret
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &secret))
			login = &cluster.MySQLLogin{User: secret.StringData["user"], Password: secret.StringData["password"]}
		}
	}
	slices.Sort(kinds)
	require.Equal(t, []string{"Secret/mysql-probe-credentials", "ServiceWithHealthchecks/mysql-db-read", "ServiceWithHealthchecks/mysql-db-write"}, kinds)
	require.NotEmpty(t, sqlStmts)
	return sqlStmts, yaml, login
}

type fencedBlock struct{ lang, text string }

// sectionBlocks returns the fenced code blocks of the level-2 section with the given heading.
func sectionBlocks(t *testing.T, md []byte, heading string) []fencedBlock {
	t.Helper()
	var blocks []fencedBlock
	in, found := false, false
	var cur *fencedBlock
	sc := bufio.NewScanner(bytes.NewReader(md))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case cur != nil && strings.HasPrefix(line, "```"):
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		case strings.HasPrefix(line, "## "):
			in = line == heading
			found = found || in
		case in && strings.HasPrefix(line, "```"):
			cur = &fencedBlock{lang: strings.TrimSpace(strings.TrimPrefix(line, "```"))}
		}
	}
	require.NoError(t, sc.Err())
	require.True(t, found, "no section %q", heading)
	return blocks
}

func finishedBefore(res cluster.Results, at time.Time) cluster.Results {
	var out cluster.Results
	for _, r := range res {
		if r.Start.Add(r.Duration).Before(at) {
			out = append(out, r)
		}
	}
	return out
}

func waitRequests(t testing.TB, loop *cluster.Traffic, since time.Time, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return len(loop.Results().Since(since)) >= n }, waitFor, 10*time.Millisecond,
		"%d requests since %s", n, since.Format(time.RFC3339Nano))
}

// waitRouted polls kube-proxy's rules until the Service port sends new connections to exactly
// the pods, and returns when it saw that.
func waitRouted(t testing.TB, c *cluster.Cluster, service string, pods ...*cluster.Pod) time.Time {
	t.Helper()
	var want []string
	for _, p := range pods {
		want = append(want, net.JoinHostPort(p.IP.String(), strconv.Itoa(servicePort)))
	}
	slices.Sort(want)
	var at time.Time
	var last []string
	require.Eventually(t, func() bool {
		eps, err := c.ProgrammedEndpoints(context.WithoutCancel(t.Context()), service, servicePort)
		if err != nil {
			return false
		}
		last = eps
		if slices.Equal(eps, want) {
			at = time.Now()
			return true
		}
		return false
	}, waitFor, 20*time.Millisecond, "kube-proxy routes %s to %v (last seen %v)", service, want, fmt.Sprint(last))
	return at
}
