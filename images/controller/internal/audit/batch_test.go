// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/types"
)

func TestCleanSetSkipsOnlyTheVersionAuditedAndForgetsIt(t *testing.T) {
	name := types.NamespacedName{Namespace: "ns", Name: "web-http-node-a"}
	audited := version{uid: "u1", rv: "10"}
	tests := map[string]struct {
		mark      bool
		take      version
		podChange bool
		wantSkip  bool
	}{
		"a Pod of the namespace changed since the LIST began": {mark: true, take: audited, podChange: true},
		"the version a sibling audited is skipped":            {mark: true, take: audited, wantSkip: true},
		"a slice written since is audited again":              {mark: true, take: version{uid: "u1", rv: "11"}},
		"a slice deleted and recreated is audited again":      {mark: true, take: version{uid: "u2", rv: "10"}},
		"a slice no sibling audited is audited on its own":    {take: audited},
	}
	for title, tc := range tests {
		t.Run(title, func(t *testing.T) {
			c := newCleanSet()
			if tc.mark {
				c.mark(name, audited, c.epoch(name.Namespace))
			}
			if tc.podChange {
				c.podChanged(name.Namespace)
			}
			assert.Equal(t, tc.wantSkip, c.take(name, tc.take))
			assert.Zero(t, c.size(), "take forgets the slice either way")
			assert.False(t, c.take(name, audited), "a second audit at the same version reads again")
		})
	}
	c := newCleanSet()
	c.mark(name, audited, 0)
	c.forget(name)
	assert.Zero(t, c.size(), "a deleted slice is forgotten")
}
