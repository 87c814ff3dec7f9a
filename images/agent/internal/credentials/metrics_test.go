// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package credentials_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
)

func problemsText(missing, wrongType, malformed, unreadable int) string {
	return fmt.Sprintf(`
# HELP swh_agent_credential_secret_problems Credential Secrets referenced by PostgreSQL and MySQL probes on this node that cannot be used, by problem (missing, wrong_type, malformed, unreadable); their probes cannot run.
# TYPE swh_agent_credential_secret_problems gauge
swh_agent_credential_secret_problems{problem="malformed"} %d
swh_agent_credential_secret_problems{problem="missing"} %d
swh_agent_credential_secret_problems{problem="unreadable"} %d
swh_agent_credential_secret_problems{problem="wrong_type"} %d
`, malformed, missing, unreadable, wrongType)
}

// TestProblemGaugeCountsEachKindOfBrokenSecret: with the agent's least-privilege Role on a real
// API server, swh_agent_credential_secret_problems counts one missing, one wrong-type, one
// malformed and one unreadable (Forbidden) Secret beside a good one, and each count drops when
// its Secret is fixed or its reference dropped.
func TestProblemGaugeCountsEachKindOfBrokenSecret(t *testing.T) {
	ctx := t.Context()
	ns := env.CreateNamespaceForTest(t, "credmetrics")
	typ := corev1.SecretType(wellknown.SecretTypePostgreSQLCredentials)
	require.NoError(t, env.Client.Create(ctx, secret(ns, "good", typ, map[string]string{"user": "app", "password": "pw"})))
	require.NoError(t, env.Client.Create(ctx, secret(ns, "opaque", corev1.SecretTypeOpaque, map[string]string{"user": "app"})))
	bad := secret(ns, "bad", typ, map[string]string{"password": "pw"})
	require.NoError(t, env.Client.Create(ctx, bad))
	require.NoError(t, env.Client.Create(ctx, secret(ns, "hidden", typ, map[string]string{"user": "app"})))
	store, _ := agentStore(t, ns, "good", "opaque", "bad", "absent")
	m := metrics.New(nil)
	require.NoError(t, testutil.CollectAndCompare(m.CredentialProblems, strings.NewReader(problemsText(0, 0, 0, 0))),
		"without a source every kind is zero")
	m.CredentialProblems.SetSource(store.Problems)

	refs := []types.NamespacedName{}
	for _, n := range []string{"good", "opaque", "bad", "absent", "hidden"} {
		refs = append(refs, types.NamespacedName{Namespace: ns, Name: n})
	}
	store.SetReferences(refs)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.NoError(c, testutil.CollectAndCompare(m.CredentialProblems, strings.NewReader(problemsText(1, 1, 1, 1))))
	}, wait, tick, "one Secret of each problem kind is counted, the good one is not")
	_, err := store.Lookup(ns, "good")
	require.NoError(t, err, "the good Secret is usable")

	// Fix the malformed Secret, create the missing one, drop the unreadable reference.
	bad.Data["user"] = []byte("app")
	require.NoError(t, env.Client.Update(ctx, bad))
	require.NoError(t, env.Client.Create(ctx, secret(ns, "absent", typ, map[string]string{"user": "app"})))
	store.SetReferences(refs[:4])
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.NoError(c, testutil.CollectAndCompare(m.CredentialProblems, strings.NewReader(problemsText(0, 1, 0, 0))))
	}, wait, tick, "fixed Secrets leave the counts; the wrong type stays")
}
