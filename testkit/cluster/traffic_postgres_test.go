// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/postgres"
)

// TestPostgreSQLTrafficNamesTheServerThatAnswered sends PostgreSQL requests through a
// Service's ClusterIP to a primary and its replica, each in its own pod: every reply names the
// pod whose server answered (its cluster_name), both pods answer, and a login the servers
// refuse fails every request with the server's reason.
func TestPostgreSQLTrafficNamesTheServerThatAnswered(t *testing.T) {
	c := cluster.Start(t, cluster.Options{Nodes: twoZones, KubeProxy: true})
	ns := c.Env.CreateNamespaceForTest(t, "pgtraffic")
	db0 := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "db-0", Node: "node-a"})
	db1 := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "db-1", Node: "node-b"})
	primary := postgres.StartForTest(t, db0.PostgreSQLOptions(postgres.Options{HBA: []string{postgres.HBASCRAM}}))
	require.NoError(t, primary.CreateRole(t.Context(), "app", "app-secret"))
	replica := primary.ReplicaForTest(t, db1.PostgreSQLOptions(postgres.Options{}))
	assert.Equal(t, db1.IP.String(), replica.Host)

	svc := createService(t, c, ns, "db", 5432, int32(primary.Port))
	writeSlice(t, c, ns, "db", "db-1", int32(primary.Port), db0.Endpoint(ready), db1.Endpoint(ready))
	c.WaitProgrammed(t, svc, 5432, db0, db1)

	login := &cluster.PostgreSQLLogin{User: "app", Password: "app-secret"}
	res := c.Requests(t, cluster.TrafficOptions{Service: svc, Port: 5432, Protocol: cluster.PostgreSQL, PostgreSQL: login, Count: 30})
	assert.Empty(t, res.Failed(), "%s", res)
	assert.Equal(t, []string{db0.Key(), db1.Key()}, res.Pods(), "both servers answer through the ClusterIP: %s", res)

	direct := c.Requests(t, cluster.TrafficOptions{Address: db1.IP.String(), Port: 5432, Protocol: cluster.PostgreSQL, PostgreSQL: login, Count: 3})
	assert.Equal(t, map[string]int{db1.Key(): 3}, direct.ByPod(), "the replica names its own pod: %s", direct)

	wrong := c.Requests(t, cluster.TrafficOptions{Service: svc, Port: 5432, Protocol: cluster.PostgreSQL,
		PostgreSQL: &cluster.PostgreSQLLogin{User: "app", Password: "wrong"}, Count: 3})
	require.Len(t, wrong.Failed(), 3, "%s", wrong)
	assert.Contains(t, wrong[0].Err, "password authentication failed")
}
