// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package postgres_test

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

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/postgres"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

const (
	// examplesSection is the heading of docs/EXAMPLES.md whose SQL the scenarios run.
	examplesSection = "## db-read and db-write over PostgreSQL"
	// servicePort is the Service port of db-read and db-write in the examples.
	servicePort = 5432
	// minInWindow is the fewest requests a loop must send in each part of a scenario: before
	// the event, inside the bound after it, and after the switch. A request is a new connection
	// with a SCRAM login, a backend fork and a query: about 30 ms on an idle machine, several
	// times that under the load of `make test` (the loop starts one every 20 ms at most).
	minInWindow = 10
	// interval between the starts of two requests of a loop.
	interval = 20 * time.Millisecond
	// loopLimit ends a request loop that a failing test forgot; the tests stop theirs long
	// before.
	loopLimit = 5 * time.Minute
	// waitFor bounds the waits for a state; the assertions on the measured times are separate,
	// so a slow switch is reported with its figure instead of a timeout.
	waitFor = 2 * time.Minute
	// publishAllowance is what a probe decision needs to reach kube-proxy's rules: the agent's
	// coalescing window (200 ms), the EndpointSlice write, kube-proxy's nftables sync (its
	// minSyncPeriod is 100 ms here; measured about 200 ms in all) — rounded up to a second.
	publishAllowance = time.Second
	// jitter is the scheduler's spread of each probe run (±10 % of the period).
	jitter = 0.1
)

// The pods of the examples: label app=db, container port postgres = 5432.
var (
	dbLabels = map[string]string{"app": "db"}
	dbPorts  = []corev1.ContainerPort{{Name: "postgres", ContainerPort: 5432, Protocol: corev1.ProtocolTCP}}
)

// databases is one scenario's world: a namespace with the examples applied, a primary in pod
// db-0 on node-a and its streaming replica in pod db-1 on node-b.
type databases struct {
	ns       string
	db0, db1 *cluster.Pod
	primary  *postgres.Server
	replica  *postgres.Server
	// login is the probe's credentials from the example Secret; the request loops use them too.
	login *cluster.PostgreSQLLogin
}

// startDatabases starts the servers in their pods, runs the example's SQL (the probe's role)
// on the primary before the replica is cloned from it, applies the example files (the Secret,
// db-read and db-write, as `make run` does), and waits until kube-proxy routes db-write to the
// primary and db-read to both. Everything is removed when the test ends.
func startDatabases(t testing.TB, s *stack.Stack) *databases {
	t.Helper()
	ex := loadExamples(t)
	c := s.Cluster
	d := &databases{ns: c.Env.CreateNamespaceForTest(t, "pg"), login: ex.login}
	d.db0 = c.AddPod(t, cluster.PodSpec{Namespace: d.ns, Name: "db-0", Node: "node-a", Labels: dbLabels, ContainerPorts: dbPorts})
	d.db1 = c.AddPod(t, cluster.PodSpec{Namespace: d.ns, Name: "db-1", Node: "node-b", Labels: dbLabels, ContainerPorts: dbPorts})
	d.primary = postgres.StartForTest(t, d.db0.PostgreSQLOptions(postgres.Options{HBA: []string{postgres.HBASCRAM}}))
	for _, stmt := range ex.sql {
		require.NoError(t, d.primary.Exec(t.Context(), stmt))
	}
	d.replica = d.primary.ReplicaForTest(t, d.db1.PostgreSQLOptions(postgres.Options{}))
	require.NoError(t, s.ApplyYAML(t.Context(), d.ns, ex.yaml))
	c.WaitProgrammed(t, d.ns+"/db-write", servicePort, d.db0)
	c.WaitProgrammed(t, d.ns+"/db-read", servicePort, d.db0, d.db1)
	return d
}

// resource reads a resource as the API server stores it (defaults filled in).
func (d *databases) resource(t testing.TB, c *cluster.Cluster, name string) *v1alpha1.ServiceWithHealthchecks {
	t.Helper()
	var swh v1alpha1.ServiceWithHealthchecks
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: d.ns, Name: name}, &swh))
	require.NotNil(t, swh.Spec.Healthcheck, "%s has a healthcheck", name)
	require.NotEmpty(t, swh.Spec.Healthcheck.Probes, "%s has probes", name)
	return &swh
}

// decisionBound is how long after a change of a server the Service's new connections may still
// go the old way: every probe needs max(failureThreshold, successThreshold) runs, each at most
// a period plus the scheduler's jitter apart, the deciding run may take its timeoutSeconds, and
// the result needs the publish allowance to reach kube-proxy.
func decisionBound(swh *v1alpha1.ServiceWithHealthchecks) time.Duration {
	hc := swh.Spec.Healthcheck
	period := time.Duration(hc.PeriodSeconds) * time.Second
	var worst time.Duration
	for _, p := range hc.Probes {
		runs := max(p.FailureThreshold, p.SuccessThreshold)
		b := time.Duration(float64(period)*(1+jitter))*time.Duration(runs) + time.Duration(p.TimeoutSeconds)*time.Second
		worst = max(worst, b)
	}
	return worst + publishAllowance
}

// The example files (docs/examples/, shown verbatim in docs/EXAMPLES.md) the scenarios apply.
var exampleFiles = []string{"docs/examples/db-credentials.yaml", "docs/examples/db.yaml"}

// examples are the SQL of docs/EXAMPLES.md's PostgreSQL section and its example files.
type examples struct {
	sql   []string
	yaml  []byte
	login *cluster.PostgreSQLLogin
}

// loadExamples reads the SQL blocks of the PostgreSQL section of docs/EXAMPLES.md, the example
// files (in order) and the credential Secret's user and password.
func loadExamples(t testing.TB) examples {
	t.Helper()
	root, err := controlplane.RepoRoot()
	require.NoError(t, err)
	md, err := os.ReadFile(filepath.Join(root, "docs", "EXAMPLES.md"))
	require.NoError(t, err)
	blocks, err := sectionBlocks(md, examplesSection)
	require.NoError(t, err)
	var ex examples
	for _, b := range blocks {
		if b.lang != "sql" {
			continue
		}
		for stmt := range strings.SplitSeq(b.text, ";") {
			if stmt = strings.TrimSpace(stmt); stmt != "" {
				ex.sql = append(ex.sql, stmt)
			}
		}
	}
	var docs [][]byte
	for _, f := range exampleFiles {
		b, err := os.ReadFile(filepath.Join(root, f))
		require.NoError(t, err)
		docs = append(docs, b)
	}
	ex.yaml = bytes.Join(docs, []byte("\n---\n"))
	objs, err := stack.DecodeYAML(ex.yaml)
	require.NoError(t, err)
	var kinds []string
	for _, u := range objs {
		kinds = append(kinds, u.GetKind()+"/"+u.GetName())
		if u.GetKind() != "Secret" {
			continue
		}
		var secret corev1.Secret
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &secret))
		ex.login = &cluster.PostgreSQLLogin{User: secret.StringData["user"], Password: secret.StringData["password"]}
	}
	slices.Sort(kinds)
	require.Equal(t, []string{"Secret/db-probe-credentials", "ServiceWithHealthchecks/db-read", "ServiceWithHealthchecks/db-write"}, kinds,
		"the objects of %v", exampleFiles)
	require.NotEmpty(t, ex.sql, "the SQL of docs/EXAMPLES.md %q", examplesSection)
	return ex
}

type fencedBlock struct {
	lang, text string
}

// sectionBlocks returns the fenced code blocks of the level-2 section with the given heading.
func sectionBlocks(md []byte, heading string) ([]fencedBlock, error) {
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
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the page: %w", err)
	}
	if !found {
		return nil, fmt.Errorf("no section %q", heading)
	}
	return blocks, nil
}

// settledOn returns the start of the first request from which on every request succeeded and
// was answered by pod, and how many such requests there are; ok is false when the last one was
// not.
func settledOn(res cluster.Results, pod string) (at time.Time, n int, ok bool) {
	i := len(res)
	for i > 0 && res[i-1].OK && res[i-1].Pod == pod {
		i--
	}
	if i == len(res) {
		return time.Time{}, 0, false
	}
	return res[i].Start, len(res) - i, true
}

// finishedBefore returns the requests that had ended before t: the ones in flight at t (say, a
// login that a stopping server cuts) belong to the event, not to the time before it.
func finishedBefore(res cluster.Results, t time.Time) cluster.Results {
	var out cluster.Results
	for _, r := range res {
		if r.Start.Add(r.Duration).Before(t) {
			out = append(out, r)
		}
	}
	return out
}

// within returns the requests that started in [from, to).
func within(res cluster.Results, from, to time.Time) cluster.Results {
	return res.Since(from).Before(to)
}

// waitRequests waits until the loop has finished n requests that started at or after since.
func waitRequests(t testing.TB, loop *cluster.Traffic, since time.Time, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return len(loop.Results().Since(since)) >= n }, waitFor, 10*time.Millisecond,
		"%d requests since %s", n, since.Format(time.RFC3339Nano))
}

// waitRouted polls kube-proxy's rules until the Service port sends new connections to exactly
// the pods, and returns when it saw that first (an upper bound of the moment the rules changed).
func waitRouted(t testing.TB, c *cluster.Cluster, service string, pods ...*cluster.Pod) time.Time {
	t.Helper()
	var want []string
	for _, p := range pods {
		want = append(want, net.JoinHostPort(p.IP.String(), strconv.Itoa(int(dbPorts[0].ContainerPort))))
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
	}, waitFor, 20*time.Millisecond, "kube-proxy routes %s to %v (last seen %v)", service, want, last)
	return at
}
