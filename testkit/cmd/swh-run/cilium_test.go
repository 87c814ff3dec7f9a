// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
)

// TestCiliumDemoComesUp is `make run DATAPLANE=cilium` until ready (`make test-cilium`): with a
// real, dual-stack cilium-agent as the kube-proxy replacement the demo publishes every example
// resource's pods and the traffic through every ClusterIP (both of web-dual's) is answered by
// them, none failing; stopping it removes the run folder.
func TestCiliumDemoComesUp(t *testing.T) {
	if !cluster.CiliumEnabled() {
		t.Skipf("the Cilium dataplane runs in `make test-cilium` (%s=1)", cluster.CiliumEnv)
	}
	cluster.SkipUnlessIsolated(t)
	base, err := os.MkdirTemp("", "swhrun-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	runDir := filepath.Join(base, "run")
	cfg, err := parse([]string{"--dataplane=cilium", "--plain", "--window=5s", "--socket=" + filepath.Join(runDir, "control.sock")}, io.Discard)
	require.NoError(t, err)
	d := startDemo(t, cfg)
	d.waitFor(4*time.Minute, func(v *View) bool { return v.Ready }, "every resource publishes its pods and the traffic is OK")
	v := d.latest.Load()
	wantIn := map[string][]string{"db-read": {"db-0", "db-1"}, "db-write": {"db-0"}, "smtp": {"vm-0"}, "web": {"vm-0"},
		"mysql-db-read": {"mysql-0", "mysql-1"}, "mysql-db-write": {"mysql-0"}}
	// The dual-stack resource: both ClusterIPs, each answered by both pods, none failing.
	require.Contains(t, v.Resources, dualStackResource)
	require.Len(t, v.Resources[dualStackResource].ClusterIPs, 2)
	for _, family := range []string{"IPv4", "IPv6"} {
		sum := v.Traffic[dualStackResource+"/"+family]
		assert.Positive(t, sum.OK, "%s traffic through %s", family, dualStackResource)
		assert.Zero(t, sum.Failed, "%s traffic through %s", family, dualStackResource)
		assert.Len(t, sum.ByPod, 2, "both pods answered over %s", family)
	}
	for name, pods := range wantIn {
		require.Contains(t, v.Resources, name)
		var in []string
		for _, p := range v.Resources[name].Ports[0].Pods {
			if p.In {
				in = append(in, p.Pod)
			}
		}
		assert.Equal(t, pods, in, "%s publishes exactly these pods", name)
		sum := v.Traffic[name]
		assert.Positive(t, sum.OK, "traffic through %s", name)
		assert.Zero(t, sum.Failed, "traffic through %s", name)
		for _, p := range pods {
			assert.Positive(t, sum.ByPod[demoNamespace+"/"+p], "%s answered through %s", p, name)
		}
	}
	require.NoError(t, d.stop())
	_, err = os.Stat(runDir)
	assert.True(t, os.IsNotExist(err), "the run folder is removed on exit")
}
