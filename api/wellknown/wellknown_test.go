// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package wellknown

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestNodeDigestIsStableAndDistinct(t *testing.T) {
	a, b := strings.Repeat("x", 240)+"1", strings.Repeat("x", 240)+"2"
	assert.Equal(t, NodeDigest(a), NodeDigest(a))
	assert.NotEqual(t, NodeDigest(a), NodeDigest(b))
	assert.Len(t, NodeDigest(a), digestLength)
}

func TestAgentLeaseName(t *testing.T) {
	long := strings.Repeat("n", 250)
	tests := map[string]struct {
		node string
		want string
	}{
		"a short node name is kept":               {node: "worker-1", want: "swh-agent-worker-1"},
		"a node name that does not fit is hashed": {node: long, want: "swh-agent-" + NodeDigest(long)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := AgentLeaseName(tc.node)
			assert.Equal(t, tc.want, got)
			assert.Empty(t, validation.IsDNS1123Subdomain(got))
		})
	}
}
