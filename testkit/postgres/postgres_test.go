// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package postgres_test

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/testkit/pki"
	"github.com/deckhouse/service-with-healthchecks/testkit/postgres"
)

// TestPrimaryReplicaPromoteStopStart walks a primary and its replica through the harness's life
// cycle and checks each step from outside, over TCP with SCRAM and TLS.
func TestPrimaryReplicaPromoteStopStart(t *testing.T) {
	ctx := t.Context()
	ca, err := pki.NewCA("test-ca")
	require.NoError(t, err)
	cert, err := ca.Server("db", nil, []net.IP{net.ParseIP("127.0.0.1")})
	require.NoError(t, err)

	primary := postgres.StartForTest(t, postgres.Options{TLS: &postgres.TLS{CertPEM: cert.CertPEM, KeyPEM: cert.KeyPEM}})
	require.NoError(t, primary.CreateRole(ctx, "app", "s3cret"))
	require.NoError(t, primary.Exec(ctx, "CREATE TABLE marker (v int); INSERT INTO marker VALUES (42); GRANT SELECT ON marker TO app"))
	replica := primary.ReplicaForTest(t, postgres.Options{})

	connect := func(s *postgres.Server, password string) (*pgx.Conn, error) {
		cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%d user=app dbname=postgres sslmode=disable", s.Host, s.Port))
		require.NoError(t, err)
		cfg.Password = password
		if s == primary {
			cfg.TLSConfig = &tls.Config{RootCAs: ca.Pool, ServerName: "127.0.0.1"}
		}
		return pgx.ConnectConfig(ctx, cfg)
	}
	inRecovery := func(s *postgres.Server) bool {
		t.Helper()
		r, err := s.InRecovery(ctx)
		require.NoError(t, err)
		return r
	}

	c, err := connect(primary, "s3cret")
	require.NoError(t, err, "SCRAM over verified TLS to the primary")
	_, isTLS := c.PgConn().Conn().(*tls.Conn)
	require.True(t, isTLS, "the primary connection uses TLS")
	require.NoError(t, c.Close(ctx))
	_, err = connect(primary, "wrong")
	require.ErrorContains(t, err, "password authentication failed")

	require.False(t, inRecovery(primary))
	require.True(t, inRecovery(replica))
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		c, err := connect(replica, "s3cret")
		require.NoError(ct, err)
		defer c.Close(ctx)
		var v int
		require.NoError(ct, c.QueryRow(ctx, "SELECT v FROM marker").Scan(&v))
		require.Equal(ct, 42, v)
	}, 30*time.Second, 100*time.Millisecond, "the replica streams the primary's data")

	require.NoError(t, replica.Promote(ctx))
	require.False(t, inRecovery(replica), "promotion ends recovery")

	require.NoError(t, primary.Stop(ctx))
	_, err = connect(primary, "s3cret")
	require.ErrorContains(t, err, "connection refused")
	require.NoError(t, primary.Start(ctx))
	c, err = connect(primary, "s3cret")
	require.NoError(t, err, "the primary answers again after Start")
	require.NoError(t, c.Close(ctx))
}

// TestServerInsideANetworkNamespace runs a server under CommandPrefix in a namespace the test
// creates: it listens there on its own address, and the superuser still reaches it over the
// Unix socket.
func TestServerInsideANetworkNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace")
	}
	ns := "swhpgtest-" + strconv.Itoa(os.Getpid())
	run := func(args ...string) {
		t.Helper()
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		require.NoError(t, err, "%v: %s", args, out)
	}
	run("ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	run("ip", "-n", ns, "link", "set", "lo", "up")
	run("ip", "-n", ns, "addr", "add", "10.250.0.1/32", "dev", "lo")

	s := postgres.StartForTest(t, postgres.Options{ListenAddress: "10.250.0.1", CommandPrefix: []string{"ip", "netns", "exec", ns}})
	require.Equal(t, 5432, s.Port, "a fresh namespace has the standard port free")
	require.NoError(t, s.CreateRole(t.Context(), "app", "pw"))
	out, err := exec.Command("ip", "netns", "exec", ns, "ss", "-Hltn", "sport = :5432").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "10.250.0.1:5432", "the server listens inside the namespace")
}
