// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package credentials_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/deckhouse/deckhouse/pkg/log"
	"github.com/deckhouse/module-sdk/pkg"
	patchablevalues "github.com/deckhouse/module-sdk/pkg/patchable-values"
	"github.com/deckhouse/module-sdk/testing/mock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/hooks/credentials"
)

// TestExhaustATenantWithHundredsOfReferencesIsBounded: one tenant with 300 resources, each
// referencing its own existing credential Secret under a long name (240 characters), beside
// smaller tenants. The values hold at most MaxSecretsPerNamespace names per namespace and
// MaxSecrets in all, filled fairly: while the total fits, every small tenant keeps all of its
// Secrets (the positive control: the big tenant takes nothing of theirs); past the total each
// namespace keeps an equal share. The problems are at most MaxProblems; every Secret left out
// is an OverLimit problem, counted per namespace in a metric, and every resource whose Secret is
// left out gets an Event that says so (at most MaxEvents per run). The values' size is bounded
// whatever the references.
func TestExhaustATenantWithHundredsOfReferencesIsBounded(t *testing.T) {
	tests := map[string]struct {
		small, perSmall int
		wantSmallKept   int // names each small tenant keeps, at least
		wantBigKept     int
		wantTotal       int
	}{
		"the big tenant is held to its share, the small ones keep everything": {small: 20, perSmall: 20, wantSmallKept: 20, wantBigKept: credentials.MaxSecretsPerNamespace, wantTotal: credentials.MaxSecretsPerNamespace + 20*20},
		"past the total every namespace keeps an equal share":                 {small: 40, perSmall: 30, wantSmallKept: credentials.MaxSecrets / 41, wantBigKept: credentials.MaxSecrets/41 + 1, wantTotal: credentials.MaxSecrets},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			long := func(i int) string { return fmt.Sprintf("pg-%03d-%s", i, strings.Repeat("x", 240)) }
			var res, sec []string
			for i := range 300 {
				res = append(res, filter(t, credentials.ResourcesFilter, resource("big", fmt.Sprintf("db-%03d", i), long(i))))
				sec = append(sec, filter(t, credentials.SecretsFilter, secret("big", long(i), goodData())))
			}
			for n := range tc.small {
				ns := fmt.Sprintf("small-%02d", n)
				for i := range tc.perSmall {
					res = append(res, filter(t, credentials.ResourcesFilter, resource(ns, fmt.Sprintf("db-%02d", i), long(i))))
					sec = append(sec, filter(t, credentials.SecretsFilter, secret(ns, long(i), goodData())))
				}
			}
			references := 300 + tc.small*tc.perSmall

			snaps := mock.NewSnapshotsMock(t)
			snaps.GetMock.When(credentials.SnapshotResources).Then(snapshots(t, res))
			snaps.GetMock.When(credentials.SnapshotSecrets).Then(snapshots(t, sec))
			snaps.GetMock.When(credentials.SnapshotMySQLSecrets).Then(snapshots(t, nil))
			values, err := patchablevalues.NewPatchableValues(map[string]any{"serviceWithHealthchecks": map[string]any{}})
			require.NoError(t, err)
			overLimit := map[string]float64{}
			mc := mock.NewMetricsCollectorMock(t)
			mc.ExpireMock.Return()
			mc.SetMock.Set(func(name string, value float64, labels map[string]string, _ ...pkg.MetricCollectorOption) {
				if name == credentials.MetricOverLimit {
					overLimit[labels["namespace"]] = value
				}
			})
			var events []map[string]any
			pc := mock.NewPatchCollectorMock(t)
			pc.CreateOrUpdateMock.Set(func(object any) { events = append(events, object.(map[string]any)) })

			require.NoError(t, credentials.Handle(t.Context(), &pkg.HookInput{
				Snapshots: snaps, Values: values, MetricsCollector: mc, PatchCollector: pc, Logger: log.NewNop(),
			}))

			patches := map[string][]byte{}
			for _, p := range values.GetPatches() {
				patches[p.Path] = p.Value
			}
			var readable []credentials.NamespaceSecrets
			require.NoError(t, json.Unmarshal(patches["/serviceWithHealthchecks/internal/credentialSecrets"], &readable))
			total := 0
			for _, r := range readable {
				total += len(r.Names)
				if r.Namespace == "big" {
					assert.Equal(t, tc.wantBigKept, len(r.Names), "the big tenant's share")
					continue
				}
				assert.GreaterOrEqual(t, len(r.Names), tc.wantSmallKept, "a small tenant's (%s) share", r.Namespace)
				assert.LessOrEqual(t, len(r.Names), tc.wantSmallKept+1, "a small tenant's (%s) share", r.Namespace)
			}
			assert.Equal(t, 1+tc.small, len(readable), "every namespace keeps Secrets")
			assert.Equal(t, tc.wantTotal, total)

			var problems []credentials.Problem
			require.NoError(t, json.Unmarshal(patches["/serviceWithHealthchecks/internal/credentialProblems"], &problems))
			assert.Equal(t, credentials.MaxProblems, len(problems))
			for _, p := range problems {
				assert.Equal(t, credentials.ProblemOverLimit, p.Kind, "%s/%s", p.Namespace, p.Name[:10])
				assert.LessOrEqual(t, len(p.ReferencedBy), credentials.MaxReferencedBy)
			}
			assert.Contains(t, problems[0].Message, "at most 64 credential Secrets per namespace and 1000 in all")
			size := len(patches["/serviceWithHealthchecks/internal/credentialSecrets"]) + len(patches["/serviceWithHealthchecks/internal/credentialProblems"])
			t.Logf("values: %d bytes for %d references", size, references)
			assert.Less(t, size, 400<<10, "the values stay far below what a Helm release holds (1 MiB)")

			sum := 0.0
			for _, v := range overLimit {
				sum += v
			}
			assert.Equal(t, float64(references-tc.wantTotal), sum, "every Secret over the bounds is counted")
			assert.Equal(t, float64(300-tc.wantBigKept), overLimit["big"])

			require.Equal(t, credentials.MaxEvents, len(events), "one Event per resource over the bounds, at most MaxEvents")
			e := events[0]
			assert.Equal(t, "events.k8s.io/v1", e["apiVersion"])
			assert.Equal(t, credentials.EventReasonOverLimit, e["reason"])
			regarding := e["regarding"].(map[string]any)
			assert.Equal(t, "ServiceWithHealthchecks", regarding["kind"])
			assert.Equal(t, "big", regarding["namespace"])
			note := e["note"].(string)
			assert.LessOrEqual(t, len(note), 1024)
			assert.Contains(t, note, "may not read the credential Secrets")
			assert.Contains(t, note, "pg-")
			assert.Equal(t, regarding["name"].(string)+".credentials-over-limit", e["metadata"].(map[string]any)["name"])
		})
	}
}
