// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

func TestSecretRefsNameTheSecretsOfPostgreSQLAndMySQLProbes(t *testing.T) {
	cases := map[string]struct {
		probes []v1alpha1.Probe
		want   []types.NamespacedName
	}{
		"no probes": {},
		"probes without Secrets": {probes: []v1alpha1.Probe{
			{TCP: &v1alpha1.TCPProbe{}}, {MySQL: &v1alpha1.MySQLProbe{}}, {PostgreSQL: &v1alpha1.PostgreSQLProbe{}},
		}},
		"a PostgreSQL and a MySQL Secret": {
			probes: []v1alpha1.Probe{
				{PostgreSQL: &v1alpha1.PostgreSQLProbe{AuthSecretName: "pg"}},
				{HTTP: &v1alpha1.HTTPProbe{}},
				{MySQL: &v1alpha1.MySQLProbe{AuthSecretName: "my"}},
			},
			want: []types.NamespacedName{{Namespace: "ns", Name: "pg"}, {Namespace: "ns", Name: "my"}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			swh := &v1alpha1.ServiceWithHealthchecks{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db"},
				Spec: v1alpha1.ServiceWithHealthchecksSpec{Healthcheck: &v1alpha1.Healthcheck{Probes: tc.probes}}}
			assert.Equal(t, tc.want, secretRefs(swh))
		})
	}
}
