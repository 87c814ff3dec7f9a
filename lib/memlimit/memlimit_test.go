// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package memlimit

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMemoryLimitLeavesHeadroomUnderTheContainerLimit(t *testing.T) {
	tests := map[string]struct {
		env    map[string]string
		want   int64
		wantOK bool
	}{
		"85 % of 512 MiB":                {env: map[string]string{"MEMORY_LIMIT": "536870912"}, want: 456340275, wantOK: true},
		"an explicit GOMEMLIMIT wins":    {env: map[string]string{"MEMORY_LIMIT": "536870912", "GOMEMLIMIT": "100MiB"}},
		"no limit: nothing is set":       {env: map[string]string{}},
		"a limit that is no number":      {env: map[string]string{"MEMORY_LIMIT": "512Mi"}},
		"a zero limit: nothing is set":   {env: map[string]string{"MEMORY_LIMIT": "0"}},
		"a negative limit is not a size": {env: map[string]string{"MEMORY_LIMIT": "-1"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := Limit(func(k string) string { return tc.env[k] })
			assert.Equal(t, tc.wantOK, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}
