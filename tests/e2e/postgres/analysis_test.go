// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package postgres_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// The measurement helpers themselves (no root needed).
func TestSettledOnFindsTheLastRunOfSuccessfulRepliesFromOnePod(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	ok := func(i int, pod string) cluster.Result { return cluster.Result{Start: at(i), OK: true, Pod: pod} }
	fail := func(i int) cluster.Result { return cluster.Result{Start: at(i), Err: "connection refused"} }
	tests := map[string]struct {
		res    cluster.Results
		wantAt time.Time
		wantN  int
		wantOK bool
	}{
		"a failover: old pod, failures, then the new pod": {
			res:    cluster.Results{ok(0, "a"), ok(1, "a"), fail(2), ok(3, "b"), fail(4), ok(5, "b"), ok(6, "b")},
			wantAt: at(5), wantN: 2, wantOK: true,
		},
		"the old pod answering late is not settled before it": {
			res:    cluster.Results{ok(0, "b"), ok(1, "a"), ok(2, "b")},
			wantAt: at(2), wantN: 1, wantOK: true,
		},
		"only the new pod all along": {
			res:    cluster.Results{ok(0, "b"), ok(1, "b")},
			wantAt: at(0), wantN: 2, wantOK: true,
		},
		"a final failure is not settled": {
			res: cluster.Results{ok(0, "b"), fail(1)},
		},
		"a final reply from another pod is not settled": {
			res: cluster.Results{ok(0, "b"), ok(1, "a")},
		},
		"no requests are not settled": {},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			gotAt, gotN, gotOK := settledOn(tt.res, "b")
			assert.Equal(t, tt.wantOK, gotOK)
			assert.Equal(t, tt.wantN, gotN)
			assert.Equal(t, tt.wantAt, gotAt)
		})
	}
}

func TestDecisionBoundOfTheExamples(t *testing.T) {
	probe := func(timeout, success, failure int32) v1alpha1.Probe {
		return v1alpha1.Probe{Mode: v1alpha1.ProbeModePostgreSQL, TimeoutSeconds: timeout, SuccessThreshold: success, FailureThreshold: failure,
			PostgreSQL: &v1alpha1.PostgreSQLProbe{TargetPort: intstr.FromString("postgres")}}
	}
	resource := func(period int32, probes ...v1alpha1.Probe) *v1alpha1.ServiceWithHealthchecks {
		return &v1alpha1.ServiceWithHealthchecks{Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Healthcheck: &v1alpha1.Healthcheck{PeriodSeconds: period, Probes: probes}}}
	}
	tests := map[string]struct {
		swh  *v1alpha1.ServiceWithHealthchecks
		want time.Duration
	}{
		"db-write: period 2 s, one failure, timeout 1 s": {
			swh:  resource(2, probe(1, 1, 1)),
			want: 2200*time.Millisecond + time.Second + publishAllowance,
		},
		"db-read: period 5 s, two failures, timeout 2 s": {
			swh:  resource(5, probe(2, 1, 2)),
			want: 11*time.Second + 2*time.Second + publishAllowance,
		},
		"the slowest probe decides": {
			swh:  resource(1, probe(1, 1, 1), probe(1, 3, 1)),
			want: 3300*time.Millisecond + time.Second + publishAllowance,
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tt.want, decisionBound(tt.swh))
		})
	}
}

func TestTheExamplesSectionHasTheSQLAndTheResources(t *testing.T) {
	ex := loadExamples(t)
	require.NotNil(t, ex.login)
	assert.NotEmpty(t, ex.login.User)
	assert.NotEmpty(t, ex.login.Password)
	assert.Contains(t, ex.sql[0], "CREATE ROLE "+ex.login.User)
}
