// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package settings_test

import (
	"testing"

	"github.com/deckhouse/module-sdk/pkg"
	patchablevalues "github.com/deckhouse/module-sdk/pkg/patchable-values"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/hooks/settings"
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
			values, err := patchablevalues.NewPatchableValues(tc.values)
			require.NoError(t, err)
			require.NoError(t, settings.Handle(t.Context(), &pkg.HookInput{Values: values}))
			patches := values.GetPatches()
			require.Len(t, patches, 1)
			assert.Equal(t, "/serviceWithHealthchecks/internal/controller/replicas", patches[0].Path)
			assert.Equal(t, tc.want, string(patches[0].Value))
		})
	}
}
