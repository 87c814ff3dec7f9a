// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/realnode"
)

func TestParseNodes(t *testing.T) {
	cfg, err := parse(nil, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, nodesNamespace, cfg.Nodes, "namespace pods stay the default")
	assert.True(t, cfg.DualStack)

	cfg, err = parse([]string{"--nodes=real"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, nodesReal, cfg.Nodes)
	assert.False(t, cfg.DualStack, "the real nodes' pod network is IPv4 only")

	_, err = parse([]string{"--nodes=real", "--dual-stack"}, io.Discard)
	require.EqualError(t, err, "--dual-stack: not with --nodes=real (the real nodes' pod network is IPv4 only)")
	_, err = parse([]string{"--nodes=real", "--dual-stack=false"}, io.Discard)
	require.NoError(t, err)
	_, err = parse([]string{"--nodes=kind"}, io.Discard)
	require.EqualError(t, err, `--nodes "kind": want namespace or real`)
}

func TestRealNodeHelpListsEveryCommand(t *testing.T) {
	d := &demo{real: &realDemo{}}
	h := d.help()
	for name := range commands {
		assert.Contains(t, h, "  "+name, "help names %s", name)
	}
	for name, c := range realCommands {
		assert.Contains(t, h, "  "+strings.TrimSpace(name+" "+c.args)+" ", "help names %s", name)
		assert.Contains(t, h, c.help, "help explains %s the real-node way", name)
	}
	assert.Contains(t, h, "nodes: real-a, real-b (real)")
	assert.Equal(t, helpText(), (&demo{}).help(), "namespace pods: the help of before")
}

// TestRealNodeDemoComesUp is `make run NODES=real` until ready (`make test-nodes`): the demo on
// two real kubelet nodes publishes every example resource's pods with the traffic through every
// ClusterIP answered by them; the control commands reach vm-0's container (fail-web takes it out
// of web only, heal-web brings it back; kill-vm makes the kubelet restart its container and it
// comes back in both), and stopping removes the run folder.
func TestRealNodeDemoComesUp(t *testing.T) {
	realnode.SkipUnlessEnabled(t)
	cluster.SkipUnlessIsolated(t)
	base, err := os.MkdirTemp("", "swhrun-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	runDir := filepath.Join(base, "run")
	sock := filepath.Join(runDir, "control.sock")
	cfg, err := parse([]string{"--nodes=real", "--plain", "--window=5s", "--socket=" + sock}, io.Discard)
	require.NoError(t, err)
	d := startDemo(t, cfg)
	latest, waitFor, stop := &d.latest, d.waitFor, d.stop
	waitFor(5*time.Minute, func(v *View) bool { return v.Ready }, "every resource publishes its pods and the traffic is OK")
	v := latest.Load()
	assertStartUp(t, v, d.out.String(), 4)
	wantIn := map[string][]string{"db-read": {"db-0", "db-1"}, "db-write": {"db-0"}, "smtp": {"vm-0"}, "web": {"vm-0"}}
	require.Len(t, v.Resources, len(wantIn), "no dual-stack resource on real nodes")
	for name, pods := range wantIn {
		require.Contains(t, v.Resources, name)
		var in []string
		for _, p := range v.Resources[name].Ports[0].Pods {
			if p.In {
				in = append(in, p.Pod)
				assert.Contains(t, []string{"real-a", "real-b"}, p.Node, "%s runs on a real node", p.Pod)
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
	assert.Regexp(t, `real-a \(kubelet pid \d+, agent pid \d+`, v.Text, "the view shows the kubelets")

	var reply bytes.Buffer
	require.NoError(t, runCtl(sock, []string{"fail-web"}, &reply))
	assert.Equal(t, "HTTP server of vm-0 answers 503\n", reply.String())
	waitFor(time.Minute, func(v *View) bool {
		smtp, web := v.Resources["smtp"].Ports[0].Pods[0], v.Resources["web"].Ports[0].Pods[0]
		return !web.In && strings.Contains(web.Why, "HTTP 503") && smtp.In
	}, "vm-0 leaves web with the probe's reason and stays in smtp")
	require.NoError(t, runCtl(sock, []string{"heal-web"}, io.Discard))
	waitFor(time.Minute, func(v *View) bool { return v.Resources["web"].Ports[0].Pods[0].In }, "vm-0 is back in web")

	reply.Reset()
	require.NoError(t, runCtl(sock, []string{"kill-vm"}, &reply))
	assert.Contains(t, reply.String(), "the kubelet restarts the container in the same pod")
	waitFor(2*time.Minute, func(v *View) bool {
		return strings.Contains(v.Text, "kill-vm: vm-0's server process") &&
			v.Resources["web"].Ports[0].Pods[0].In && v.Resources["smtp"].Ports[0].Pods[0].In
	}, "vm-0's restarted container serves web and smtp again")

	err = runCtl(sock, []string{"delete-node", "real-a"}, io.Discard)
	require.ErrorContains(t, err, "not offered on real nodes")

	require.NoError(t, stop(), "the demo stops cleanly")
	assert.NoDirExists(t, runDir, "the run folder and its socket are removed")
}
