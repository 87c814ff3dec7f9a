// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package credentials_test

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"github.com/deckhouse/deckhouse/pkg/log"
	"github.com/deckhouse/module-sdk/pkg"
	"github.com/deckhouse/module-sdk/pkg/jq"
	patchablevalues "github.com/deckhouse/module-sdk/pkg/patchable-values"
	"github.com/deckhouse/module-sdk/testing/mock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/hooks/credentials"
)

const password = "s3cr3t-password-value"

func resource(namespace, name string, secrets ...string) *v1alpha1.ServiceWithHealthchecks {
	r := &v1alpha1.ServiceWithHealthchecks{
		TypeMeta:   metav1.TypeMeta{APIVersion: "network.deckhouse.io/v1alpha1", Kind: "ServiceWithHealthchecks"},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Healthcheck: &v1alpha1.Healthcheck{},
		},
	}
	// A TCP probe without credentials sits among the PostgreSQL ones.
	r.Spec.Healthcheck.Probes = append(r.Spec.Healthcheck.Probes, v1alpha1.Probe{TCP: &v1alpha1.TCPProbe{}})
	for _, s := range secrets {
		r.Spec.Healthcheck.Probes = append(r.Spec.Healthcheck.Probes,
			v1alpha1.Probe{PostgreSQL: &v1alpha1.PostgreSQLProbe{AuthSecretName: s}})
	}
	return r
}

func secret(namespace, name string, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Type:       wellknown.SecretTypePostgreSQLCredentials,
		Data:       map[string][]byte{},
	}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

func goodData() map[string]string {
	return map[string]string{"user": "app", "password": password, "tlsMode": "VerifyCA", "caCert": "-----BEGIN CERTIFICATE-----"}
}

// filter runs a hook's jq filter over a whole object, as the platform does before the hook sees it.
func filter(t *testing.T, query string, obj any) string {
	t.Helper()
	q, err := jq.NewQuery(query)
	require.NoError(t, err)
	res, err := q.FilterObject(t.Context(), obj)
	require.NoError(t, err)
	return res.String()
}

func snapshots(t *testing.T, filtered []string) []pkg.Snapshot {
	t.Helper()
	out := make([]pkg.Snapshot, 0, len(filtered))
	for _, f := range filtered {
		s := mock.NewSnapshotMock(t)
		s.UnmarshalToMock.Set(func(v any) error { return json.Unmarshal([]byte(f), v) })
		s.StringMock.Optional().Return(f)
		out = append(out, s)
	}
	return out
}

func TestFiltersKeepKeyNamesButNeverValues(t *testing.T) {
	s := secret("team-a", "pg", goodData())
	got := filter(t, credentials.SecretsFilter, s)

	var snap credentials.Secret
	require.NoError(t, json.Unmarshal([]byte(got), &snap))
	assert.Equal(t, credentials.Secret{
		Namespace: "team-a", Name: "pg", Type: wellknown.SecretTypePostgreSQLCredentials,
		Keys: []string{"caCert", "password", "tlsMode", "user"}, TLSModeKnown: true,
	}, snap)
	assert.NotContains(t, got, password, "the filter output must not carry values")
	assert.NotContains(t, got, base64.StdEncoding.EncodeToString([]byte(password)))
	assert.NotContains(t, got, "VerifyCA")
}

func TestFilterRecognisesTLSModes(t *testing.T) {
	cases := map[string]struct {
		tlsMode string
		set     bool
		want    bool
	}{
		"an absent tlsMode is fine":          {want: true},
		"a known tlsMode is recognised":      {tlsMode: "SkipVerification", set: true, want: true},
		"an unknown tlsMode is flagged":      {tlsMode: "require", set: true, want: false},
		"a tlsMode in wrong case is flagged": {tlsMode: "disabled", set: true, want: false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			data := map[string]string{"user": "app"}
			if tc.set {
				data["tlsMode"] = tc.tlsMode
			}
			var snap credentials.Secret
			require.NoError(t, json.Unmarshal([]byte(filter(t, credentials.SecretsFilter, secret("ns", "pg", data))), &snap))
			assert.Equal(t, tc.want, snap.TLSModeKnown)
		})
	}
}

func TestResourcesFilterCollectsUniqueReferences(t *testing.T) {
	got := filter(t, credentials.ResourcesFilter, resource("team-a", "db", "pg-b", "pg-a", "pg-b"))
	var r credentials.Resource
	require.NoError(t, json.Unmarshal([]byte(got), &r))
	assert.Equal(t, credentials.Resource{Namespace: "team-a", Name: "db", Secrets: []string{"pg-a", "pg-b"}, MySQLSecrets: []string{}}, r)

	got = filter(t, credentials.ResourcesFilter, resource("team-a", "web"))
	require.NoError(t, json.Unmarshal([]byte(got), &r))
	assert.Empty(t, r.Secrets, "a resource without PostgreSQL probes references nothing")
}

func TestResourcesFilterCollectsMySQLReferencesApart(t *testing.T) {
	r := resource("team-a", "db", "pg-a")
	r.Spec.Healthcheck.Probes = append(r.Spec.Healthcheck.Probes,
		v1alpha1.Probe{MySQL: &v1alpha1.MySQLProbe{AuthSecretName: "my-b"}},
		v1alpha1.Probe{MySQL: &v1alpha1.MySQLProbe{AuthSecretName: "my-a"}},
		v1alpha1.Probe{MySQL: &v1alpha1.MySQLProbe{AuthSecretName: "my-b"}})
	var got credentials.Resource
	require.NoError(t, json.Unmarshal([]byte(filter(t, credentials.ResourcesFilter, r)), &got))
	assert.Equal(t, credentials.Resource{Namespace: "team-a", Name: "db", Secrets: []string{"pg-a"}, MySQLSecrets: []string{"my-a", "my-b"}}, got)
}

func TestComputeMatchesTheTypeTheProbeNeeds(t *testing.T) {
	resources := []credentials.Resource{
		{Namespace: "a", Name: "orders", MySQLSecrets: []string{"my-main", "pg-main", "my-bad"}},
		{Namespace: "a", Name: "billing", Secrets: []string{"pg-main", "my-main"}},
	}
	secrets := []credentials.Secret{
		{Namespace: "a", Name: "pg-main", Type: wellknown.SecretTypePostgreSQLCredentials, Keys: []string{"user"}, TLSModeKnown: true},
		{Namespace: "a", Name: "my-main", Type: wellknown.SecretTypeMySQLCredentials, Keys: []string{"user", "password"}, TLSModeKnown: true},
		{Namespace: "a", Name: "my-bad", Type: wellknown.SecretTypeMySQLCredentials, Keys: []string{"password"}, TLSModeKnown: true},
	}
	readable, problems := credentials.Compute(resources, secrets)
	assert.Equal(t, []credentials.NamespaceSecrets{{Namespace: "a", Names: []string{"my-bad", "my-main", "pg-main"}}}, readable)
	assert.Equal(t, []credentials.Problem{
		{Namespace: "a", Name: "my-bad", Kind: credentials.ProblemMalformed, ReferencedBy: []string{"orders"}, Message: "the key user is missing"},
		{Namespace: "a", Name: "my-main", Kind: credentials.ProblemMissing, ReferencedBy: []string{"billing"},
			Message: `no Secret "my-main" of type network.deckhouse.io/postgresql-credentials in namespace "a" (it is absent or has another type)`},
		{Namespace: "a", Name: "pg-main", Kind: credentials.ProblemMissing, ReferencedBy: []string{"orders"},
			Message: `no Secret "pg-main" of type network.deckhouse.io/mysql-credentials in namespace "a" (it is absent or has another type)`},
	}, problems)
}

func TestComputeGrantsOnlyReferencedCredentialSecrets(t *testing.T) {
	cases := map[string]struct {
		resources    []credentials.Resource
		secrets      []credentials.Secret
		wantReadable []credentials.NamespaceSecrets
		wantProblems []credentials.Problem
	}{
		"nothing referenced grants nothing even when credential Secrets exist": {
			resources:    []credentials.Resource{{Namespace: "a", Name: "web"}},
			secrets:      []credentials.Secret{{Namespace: "a", Name: "pg", Keys: []string{"user"}, TLSModeKnown: true}},
			wantReadable: []credentials.NamespaceSecrets{},
			wantProblems: []credentials.Problem{},
		},
		"references in two namespaces are grouped and sorted": {
			resources: []credentials.Resource{
				{Namespace: "b", Name: "orders", Secrets: []string{"orders-db"}},
				{Namespace: "a", Name: "db", Secrets: []string{"pg-replica", "pg-main"}},
				{Namespace: "a", Name: "db2", Secrets: []string{"pg-main"}},
			},
			secrets: []credentials.Secret{
				{Namespace: "a", Name: "pg-main", Keys: []string{"user", "password"}, TLSModeKnown: true},
				{Namespace: "a", Name: "pg-replica", Keys: []string{"user"}, TLSModeKnown: true},
				{Namespace: "a", Name: "unreferenced", Keys: []string{"user"}, TLSModeKnown: true},
				{Namespace: "b", Name: "orders-db", Keys: []string{"user"}, TLSModeKnown: true},
			},
			wantReadable: []credentials.NamespaceSecrets{
				{Namespace: "a", Names: []string{"pg-main", "pg-replica"}},
				{Namespace: "b", Names: []string{"orders-db"}},
			},
			wantProblems: []credentials.Problem{},
		},
		"a Secret of the same name in another namespace does not count": {
			resources:    []credentials.Resource{{Namespace: "a", Name: "db", Secrets: []string{"pg"}}},
			secrets:      []credentials.Secret{{Namespace: "b", Name: "pg", Keys: []string{"user"}, TLSModeKnown: true}},
			wantReadable: []credentials.NamespaceSecrets{},
			wantProblems: []credentials.Problem{{
				Namespace: "a", Name: "pg", Kind: credentials.ProblemMissing, ReferencedBy: []string{"db"},
				Message: `no Secret "pg" of type network.deckhouse.io/postgresql-credentials in namespace "a" (it is absent or has another type)`,
			}},
		},
		"a malformed Secret is still readable and is reported": {
			resources: []credentials.Resource{
				{Namespace: "a", Name: "db2", Secrets: []string{"pg"}},
				{Namespace: "a", Name: "db1", Secrets: []string{"pg"}},
			},
			secrets:      []credentials.Secret{{Namespace: "a", Name: "pg", Keys: []string{"password", "clientCert"}, TLSModeKnown: false}},
			wantReadable: []credentials.NamespaceSecrets{{Namespace: "a", Names: []string{"pg"}}},
			wantProblems: []credentials.Problem{{
				Namespace: "a", Name: "pg", Kind: credentials.ProblemMalformed, ReferencedBy: []string{"db1", "db2"},
				Message: "the key user is missing; tlsMode is not one of Disabled, SkipVerification, VerifyCA, VerifyAll; clientCert and clientKey must be set together",
			}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			readable, problems := credentials.Compute(tc.resources, tc.secrets)
			assert.Equal(t, tc.wantReadable, readable)
			assert.Equal(t, tc.wantProblems, problems)
		})
	}
}

func TestHandleWritesValuesAndMetricsFromSnapshots(t *testing.T) {
	res := []string{
		filter(t, credentials.ResourcesFilter, resource("team-a", "db", "pg-main", "pg-missing")),
		filter(t, credentials.ResourcesFilter, resource("team-b", "orders", "orders-db")),
	}
	bad := goodData()
	delete(bad, "user")
	sec := []string{
		filter(t, credentials.SecretsFilter, secret("team-a", "pg-main", goodData())),
		filter(t, credentials.SecretsFilter, secret("team-a", "other", goodData())),
		filter(t, credentials.SecretsFilter, secret("team-b", "orders-db", bad)),
	}

	snaps := mock.NewSnapshotsMock(t)
	snaps.GetMock.When(credentials.SnapshotResources).Then(snapshots(t, res))
	snaps.GetMock.When(credentials.SnapshotSecrets).Then(snapshots(t, sec))
	snaps.GetMock.When(credentials.SnapshotMySQLSecrets).Then(snapshots(t, nil))

	values, err := patchablevalues.NewPatchableValues(map[string]any{"serviceWithHealthchecks": map[string]any{}})
	require.NoError(t, err)

	type metric struct {
		name   string
		value  float64
		labels map[string]string
	}
	var metrics []metric
	var expired []string
	mc := mock.NewMetricsCollectorMock(t)
	mc.ExpireMock.Set(func(group string) { expired = append(expired, group) })
	mc.SetMock.Set(func(name string, value float64, labels map[string]string, _ ...pkg.MetricCollectorOption) {
		metrics = append(metrics, metric{name, value, labels})
	})

	err = credentials.Handle(t.Context(), &pkg.HookInput{
		Snapshots: snaps, Values: values, MetricsCollector: mc, Logger: log.NewNop(),
	})
	require.NoError(t, err)

	patches := map[string]string{}
	for _, p := range values.GetPatches() {
		patches[p.Path] = string(p.Value)
	}
	assert.JSONEq(t, `[{"namespace":"team-a","names":["pg-main"]},{"namespace":"team-b","names":["orders-db"]}]`,
		patches["/serviceWithHealthchecks/internal/credentialSecrets"])
	problems := patches["/serviceWithHealthchecks/internal/credentialProblems"]
	var got []credentials.Problem
	require.NoError(t, json.Unmarshal([]byte(problems), &got))
	require.Len(t, got, 2)
	assert.Equal(t, []string{"team-a/pg-missing Missing", "team-b/orders-db Malformed"},
		[]string{got[0].Namespace + "/" + got[0].Name + " " + got[0].Kind, got[1].Namespace + "/" + got[1].Name + " " + got[1].Kind})
	assert.False(t, strings.Contains(problems, password), "values must not carry Secret values")

	assert.Equal(t, []string{credentials.MetricGroup}, expired, "old problem metrics are expired on every run")
	assert.Equal(t, []metric{
		{credentials.MetricProblem, 1, map[string]string{"namespace": "team-a", "name": "pg-missing", "problem": "Missing"}},
		{credentials.MetricProblem, 1, map[string]string{"namespace": "team-b", "name": "orders-db", "problem": "Malformed"}},
	}, metrics)
}

func TestConfigSubscribesToResourcesAndCredentialSecretsOnly(t *testing.T) {
	require.NoError(t, credentials.Config.Validate())
	require.Len(t, credentials.Config.Kubernetes, 3)
	secrets := credentials.Config.Kubernetes[1]
	assert.Equal(t, "Secret", secrets.Kind)
	require.NotNil(t, secrets.FieldSelector, "the hook must not watch every Secret of the cluster")
	assert.Equal(t, []pkg.FieldSelectorRequirement{{Field: "type", Operator: "Equals", Value: wellknown.SecretTypePostgreSQLCredentials}},
		secrets.FieldSelector.MatchExpressions)
	mySQLSecrets := credentials.Config.Kubernetes[2]
	assert.Equal(t, "Secret", mySQLSecrets.Kind)
	require.NotNil(t, mySQLSecrets.FieldSelector, "the hook must not watch every Secret of the cluster")
	assert.Equal(t, []pkg.FieldSelectorRequirement{{Field: "type", Operator: "Equals", Value: wellknown.SecretTypeMySQLCredentials}},
		mySQLSecrets.FieldSelector.MatchExpressions)
}
