// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/credentials"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/postgres"
)

const (
	pgProbeUser     = "swh_probe"
	pgProbePassword = "probe-secret-4711"
	pgSecretName    = "db-probe-credentials"
	queryIsPrimary  = "SELECT NOT pg_is_in_recovery()"
	queryAnswers    = "SELECT 1"
)

var pgPorts = []corev1.ContainerPort{{Name: "postgres", ContainerPort: 5432, Protocol: corev1.ProtocolTCP}}

func postgresProbe(query string, failureThreshold int32) v1alpha1.Probe {
	return v1alpha1.Probe{Mode: v1alpha1.ProbeModePostgreSQL, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: failureThreshold,
		PostgreSQL: &v1alpha1.PostgreSQLProbe{TargetPort: intstr.FromString("postgres"), DBName: "postgres", Query: query, AuthSecretName: pgSecretName}}
}

// Issue 7, test 6: db-write (a probe true only on the primary) and db-read (true on every
// server that answers) over a real PostgreSQL 15 primary in a pod on node-a and its streaming
// replica in a pod on node-b, one agent per node, the probes logging in with a credential Secret
// (SCRAM). db-write publishes only the primary; once the replica is promoted both servers say
// they are primaries and both are published; once the old primary is stopped only the new one
// is. db-read keeps both, unwritten, while both answer, and drops the stopped one. Traffic
// through kube-proxy follows: every reply names the pod whose server answered.
func TestPostgresDBWriteFollowsThePrimaryAndDBReadEveryServerThatAnswers(t *testing.T) {
	c := testCluster(t)
	ns := c.Env.CreateNamespaceForTest(t, "pg")
	labels := map[string]string{"app": "db"}
	db0 := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "db-0", Node: "node-a", Labels: labels, ContainerPorts: pgPorts})
	db1 := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "db-1", Node: "node-b", Labels: labels, ContainerPorts: pgPorts})
	primary := postgres.StartForTest(t, db0.PostgreSQLOptions(postgres.Options{HBA: []string{postgres.HBASCRAM}}))
	// The role exists before the base backup, so the replica has it from its first start.
	require.NoError(t, primary.CreateRole(t.Context(), pgProbeUser, pgProbePassword))
	replica := primary.ReplicaForTest(t, db1.PostgreSQLOptions(postgres.Options{}))
	inRecovery, err := replica.InRecovery(t.Context())
	require.NoError(t, err)
	require.True(t, inRecovery, "db-1 starts as a streaming replica")

	require.NoError(t, c.Env.Client.Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pgSecretName},
		Type:       wellknown.SecretTypePostgreSQLCredentials,
		StringData: map[string]string{credentials.KeyUser: pgProbeUser, credentials.KeyPassword: pgProbePassword, credentials.KeyTLSMode: string(credentials.TLSDisabled)},
	}))
	port := []v1alpha1.ServicePort{namedPort("postgres", 5432, intstr.FromString("postgres"))}
	// db-write leaves at the first failure, as in docs/EXAMPLES.md; db-read tolerates two slow
	// probes on a loaded machine (a timeout would withdraw a server that still answers).
	createResource(t, c, ns, "db-write", labels, port, postgresProbe(queryIsPrimary, 1))
	createResource(t, c, ns, "db-read", labels, port, postgresProbe(queryAnswers, 3))
	agentA := startAgent(t, c, "node-a")
	agentB := startAgent(t, c, "node-b")

	// Before: db-write is the primary only, db-read both.
	eventuallySlices(t, c, ns, "db-write", map[string]map[string]string{
		"db-write-postgres-node-a": {ip(db0): "TTF"},
		"db-write-postgres-node-b": {ip(db1): "FFF"},
	})
	readBefore := eventuallySlices(t, c, ns, "db-read", map[string]map[string]string{
		"db-read-postgres-node-a": {ip(db0): "TTF"},
		"db-read-postgres-node-b": {ip(db1): "TTF"},
	})
	eventuallyEvent(t, c, ns, agent.ReasonPortNotReady, "db-write: pod db-1, port postgres: probe 0 (PostgreSQL): query returned false")
	login := &cluster.PostgreSQLLogin{User: pgProbeUser, Password: pgProbePassword}
	c.WaitProgrammed(t, ns+"/db-write", 5432, db0)
	c.WaitProgrammed(t, ns+"/db-read", 5432, db0, db1)
	writes := c.Requests(t, cluster.TrafficOptions{Service: ns + "/db-write", Port: 5432, Protocol: cluster.PostgreSQL, PostgreSQL: login, Count: 20})
	assert.Equal(t, map[string]int{db0.Key(): 20}, writes.ByPod(), "db-write reaches only the primary: %s", writes)
	reads := c.Requests(t, cluster.TrafficOptions{Service: ns + "/db-read", Port: 5432, Protocol: cluster.PostgreSQL, PostgreSQL: login, Count: 30})
	assert.Empty(t, reads.Failed(), "%s", reads)
	assert.Equal(t, []string{db0.Key(), db1.Key()}, reads.Pods(), "db-read balances over both servers: %s", reads)

	// Promotion: both servers answer as primaries (the database allows it until the old one
	// stops), so db-write publishes both; db-read is not touched.
	require.NoError(t, replica.Promote(t.Context()))
	eventuallySlices(t, c, ns, "db-write", map[string]map[string]string{
		"db-write-postgres-node-a": {ip(db0): "TTF"},
		"db-write-postgres-node-b": {ip(db1): "TTF"},
	})
	eventuallyEvent(t, c, ns, agent.ReasonPortReady, "db-write: pod db-1, port postgres: probes pass")
	// Two more rounds of the four probes (one per second each) after the promotion was seen.
	runs := agentA.probeRuns() + agentB.probeRuns()
	require.Eventually(t, func() bool { return agentA.probeRuns()+agentB.probeRuns() >= runs+8 }, 30*time.Second, 50*time.Millisecond)
	readDuring, err := slicesOf(t.Context(), c, ns, "db-read")
	require.NoError(t, err)
	for name, s := range readBefore {
		assert.Equal(t, s.RV, readDuring[name].RV, "db-read slice %s is not written while both servers answer", name)
		assert.Equal(t, s.Endpoints, readDuring[name].Endpoints, "db-read slice %s", name)
	}

	// The old primary stops: it leaves both ports; only the new primary remains.
	require.NoError(t, primary.Stop(t.Context()))
	eventuallySlices(t, c, ns, "db-write", map[string]map[string]string{
		"db-write-postgres-node-a": {ip(db0): "FFF"},
		"db-write-postgres-node-b": {ip(db1): "TTF"},
	})
	eventuallySlices(t, c, ns, "db-read", map[string]map[string]string{
		"db-read-postgres-node-a": {ip(db0): "FFF"},
		"db-read-postgres-node-b": {ip(db1): "TTF"},
	})
	// The reason depends on where the shutdown caught the probe: connection refused, or a
	// query error (57P01 terminating connection, 57P03 shutting down).
	eventuallyEvent(t, c, ns, agent.ReasonPortNotReady, "db-write: pod db-0, port postgres: probe 0 (PostgreSQL): ")
	c.WaitProgrammed(t, ns+"/db-write", 5432, db1)
	c.WaitProgrammed(t, ns+"/db-read", 5432, db1)
	writes = c.Requests(t, cluster.TrafficOptions{Service: ns + "/db-write", Port: 5432, Protocol: cluster.PostgreSQL, PostgreSQL: login, Count: 20})
	assert.Equal(t, map[string]int{db1.Key(): 20}, writes.ByPod(), "db-write reaches only the new primary: %s", writes)
	reads = c.Requests(t, cluster.TrafficOptions{Service: ns + "/db-read", Port: 5432, Protocol: cluster.PostgreSQL, PostgreSQL: login, Count: 20})
	assert.Equal(t, map[string]int{db1.Key(): 20}, reads.ByPod(), "db-read reaches only the server that answers: %s", reads)
}
