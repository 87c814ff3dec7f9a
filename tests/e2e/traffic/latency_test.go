// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/metrics"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// programmingLatency is kube-proxy's network programming latency: from a slice's
// endpoints.kubernetes.io/last-change-trigger-time to the rules that carry it.
const programmingLatency = "kubeproxy_network_programming_duration_seconds_count"

// kube-proxy measures its network programming latency (the SLI operators watch) only for slices
// that carry endpoints.kubernetes.io/last-change-trigger-time. The agent stamps every write with
// the end of the probe run that decided it: a pod whose probe starts failing is written with a
// trigger time after the failure began and before the write, and kube-proxy observes a latency
// for the change it programs.
func TestKubeProxyMeasuresTheProgrammingLatencyOfAProbeDecision(t *testing.T) {
	s := testStack(t)
	c := s.Cluster
	require.NotEmpty(t, c.KubeProxyMetrics(), "the stack runs kube-proxy")
	ns := c.Env.CreateNamespaceForTest(t, "programming-latency")
	labels := map[string]string{"app": "web"}
	a := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-a", Node: "node-a", Labels: labels, ContainerPorts: webPorts})
	b := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-b", Node: "node-b", Labels: labels, ContainerPorts: webPorts})
	srvA := a.ServeHTTP(t, 8080)
	b.ServeHTTP(t, 8080)
	createResource(t, c, kit.Resource(ns, "web", labels,
		[]v1alpha1.ServicePort{e2e.ServicePort("http", 80, intstr.FromString("http"))},
		kit.HTTPProbe(intstr.FromString("http"))))
	kit.EventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(a): "TTF"}, "web-http-node-b": {ip(b): "TTF"}})
	c.WaitProgrammed(t, ns+"/web", 80, a, b)

	first := triggerTime(t, c, ns, "web-http-node-a")
	before := scrapeCount(t, c)

	failing := time.Now()
	srvA.SetHTTPStatus(http.StatusServiceUnavailable)
	kit.EventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{"web-http-node-a": {ip(a): "FFF"}, "web-http-node-b": {ip(b): "TTF"}})
	written := time.Now()
	c.WaitProgrammed(t, ns+"/web", 80, b)

	trigger := triggerTime(t, c, ns, "web-http-node-a")
	assert.True(t, trigger.After(first), "the write carries a new trigger time: %s, the first write's %s", trigger, first)
	assert.False(t, trigger.Before(failing), "the trigger time %s is not before the pod started failing (%s)", trigger, failing)
	assert.False(t, trigger.After(written), "the trigger time %s is not after the write was seen (%s)", trigger, written)
	require.Eventually(t, func() bool { return scrapeCount(t, c) > before }, waitFor, poll,
		"kube-proxy observes a network programming latency for the change (%s was %v)", programmingLatency, before)
}

// triggerTime reads the trigger time of a slice (it must carry one).
func triggerTime(t *testing.T, c *cluster.Cluster, ns, name string) time.Time {
	t.Helper()
	s := &discoveryv1.EndpointSlice{}
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, s))
	v, ok := s.Annotations[corev1.EndpointsLastChangeTriggerTime]
	require.True(t, ok, "slice %s carries %s: %v", name, corev1.EndpointsLastChangeTriggerTime, s.Annotations)
	at, err := time.Parse(time.RFC3339Nano, v)
	require.NoError(t, err)
	return at
}

// scrapeCount reads how many network programming latencies kube-proxy has observed.
func scrapeCount(t *testing.T, c *cluster.Cluster) float64 {
	t.Helper()
	fams, err := metrics.Get(t.Context(), c.KubeProxyMetrics())
	require.NoError(t, err)
	return fams.Sum(programmingLatency, nil)
}
