// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster_test

import (
	"fmt"
	"net"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/postgres"
)

// TestPostgreSQLRunsInsideAPod starts a real PostgreSQL server inside a pod's network namespace
// (the PostgreSQL harness with the pod's command prefix and address) and queries it through
// the Service's ClusterIP: the server that answers reports the pod's address as its own.
func TestPostgreSQLRunsInsideAPod(t *testing.T) {
	c := cluster.Start(t, cluster.Options{Nodes: twoZones, KubeProxy: true})
	ns := c.Env.CreateNamespaceForTest(t, "pg")
	db := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "db-0", Node: "node-a"})
	srv := postgres.StartForTest(t, postgres.Options{
		ListenAddress: db.IP.String(),
		CommandPrefix: db.CommandPrefix(),
		HBA:           []string{"host all all all trust"},
	})
	assert.Equal(t, db.IP.String(), srv.Host)

	svc := createService(t, c, ns, "db", 5432, int32(srv.Port))
	writeSlice(t, c, ns, "db", "db-1", int32(srv.Port), db.Endpoint(ready))
	c.WaitProgrammed(t, svc, 5432, db)

	var service corev1.Service
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "db"}, &service))
	conn, err := pgx.Connect(t.Context(), fmt.Sprintf("host=%s port=5432 user=%s dbname=postgres sslmode=disable connect_timeout=5",
		service.Spec.ClusterIP, postgres.Superuser))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(t.Context()) })

	var serverAddr net.IP
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT host(inet_server_addr())::inet").Scan(&serverAddr))
	assert.Equal(t, db.IP.String(), serverAddr.String(), "the server that answered runs inside the pod")

	// It is not reachable on the cluster namespace's own loopback: it lives in the pod.
	_, err = net.Dial("tcp", net.JoinHostPort("127.0.0.1", fmt.Sprint(srv.Port)))
	assert.Error(t, err, "PostgreSQL must not listen in the cluster namespace")
}
