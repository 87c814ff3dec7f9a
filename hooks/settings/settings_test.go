// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package settings_test

import (
	"testing"
	"time"

	"github.com/deckhouse/module-sdk/pkg"
	patchablevalues "github.com/deckhouse/module-sdk/pkg/patchable-values"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/hooks/settings"
)

// run runs the hook on values and returns its patches by path.
func run(t *testing.T, values map[string]any) map[string]string {
	t.Helper()
	pv, err := patchablevalues.NewPatchableValues(values)
	require.NoError(t, err)
	require.NoError(t, settings.Handle(t.Context(), &pkg.HookInput{Values: pv}))
	out := map[string]string{}
	for _, p := range pv.GetPatches() {
		out[p.Path] = string(p.Value)
	}
	return out
}

const (
	replicasPath = "/serviceWithHealthchecks/internal/controller/replicas"
	intervalPath = "/serviceWithHealthchecks/internal/agent/leaseRenewInterval"
)

func TestReplicasFollowHighAvailability(t *testing.T) {
	cases := map[string]struct {
		values map[string]any
		want   string
	}{
		"nothing known means high availability": {
			values: map[string]any{"serviceWithHealthchecks": map[string]any{}},
			want:   "2",
		},
		"a single-master cluster runs one replica": {
			values: map[string]any{"global": map[string]any{"highAvailability": false}, "serviceWithHealthchecks": map[string]any{}},
			want:   "1",
		},
		"the module setting wins over the platform's": {
			values: map[string]any{
				"global":                  map[string]any{"highAvailability": false},
				"serviceWithHealthchecks": map[string]any{"highAvailability": true},
			},
			want: "2",
		},
		"the module can turn high availability off": {
			values: map[string]any{
				"global":                  map[string]any{"highAvailability": true},
				"serviceWithHealthchecks": map[string]any{"highAvailability": false},
			},
			want: "1",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			patches := run(t, tc.values)
			assert.Len(t, patches, 2, "the replica count and the renewal interval: %v", patches)
			assert.Equal(t, tc.want, patches[replicasPath])
		})
	}
}

// Issue 16 part 6: the agents renew their Lease every quarter of the controller's grace, at most
// every 10 s, so a short grace no longer withdraws and restores endpoints on every renewal.
func TestTheLeaseRenewIntervalIsAQuarterOfTheGraceAtMostTenSeconds(t *testing.T) {
	cases := map[string]struct {
		grace any // nil: the setting is absent
		want  string
	}{
		"the default grace keeps the agents' default interval":    {grace: "40s", want: `"10s"`},
		"an absent grace is the default one":                      {grace: nil, want: `"10s"`},
		"a longer grace stays at 10 s":                            {grace: "1m30s", want: `"10s"`},
		"an hour stays at 10 s":                                   {grace: "1h", want: `"10s"`},
		"the issue's 6 s grace renews every 1.5 s":                {grace: "6s", want: `"1.5s"`},
		"20 s renews every 5 s":                                   {grace: "20s", want: `"5s"`},
		"the smallest grace the schema admits renews each second": {grace: "4s", want: `"1s"`},
		"a grace in milliseconds":                                 {grace: "4500ms", want: `"1.125s"`},
		"sub-millisecond quarters are truncated":                  {grace: "5.0001s", want: `"1.25s"`},
		"a fractional minute":                                     {grace: "1.5m", want: `"10s"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			module := map[string]any{}
			if tc.grace != nil {
				module["agentLostGrace"] = tc.grace
			}
			patches := run(t, map[string]any{"serviceWithHealthchecks": module})
			assert.Equal(t, tc.want, patches[intervalPath])
		})
	}
}

func TestEveryAdmittedGraceFitsFourRenewals(t *testing.T) {
	for _, grace := range []time.Duration{settings.MinAgentLostGrace, 5 * time.Second, 39 * time.Second, settings.DefaultAgentLostGrace, time.Hour} {
		d := settings.RenewInterval(grace)
		assert.LessOrEqual(t, settings.RenewalsPerGrace*d, grace, "grace %s, interval %s", grace, d)
		assert.GreaterOrEqual(t, d, time.Second, "no agent renews more than once a second (grace %s)", grace)
		assert.LessOrEqual(t, d, settings.MaxLeaseRenewInterval, "grace %s", grace)
	}
}

func TestAGraceThatIsNotADurationFailsTheHookAndWritesNothing(t *testing.T) {
	cases := map[string]struct {
		grace   string
		wantErr string
	}{
		"a number without a unit": {grace: "40", wantErr: `agentLostGrace "40": time: missing unit`},
		"words":                   {grace: "forty seconds", wantErr: `agentLostGrace "forty seconds"`},
		"zero":                    {grace: "0s", wantErr: `agentLostGrace "0s": must be positive`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			pv, err := patchablevalues.NewPatchableValues(map[string]any{"serviceWithHealthchecks": map[string]any{"agentLostGrace": tc.grace}})
			require.NoError(t, err)
			err = settings.Handle(t.Context(), &pkg.HookInput{Values: pv})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
			assert.Empty(t, pv.GetPatches(), "a failed hook writes no value")
		})
	}
}
