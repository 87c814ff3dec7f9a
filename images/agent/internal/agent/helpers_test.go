// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"context"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/agent"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/scheduler"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/shard"
)

// shared is one cluster (API server, two nodes, one kube-proxy) for the tests; each test uses
// its own namespace.
var shared cluster.Shared

// TestMain isolates the binary (own network, mount and PID namespaces), stops the shared
// cluster after the tests and fails the package if they leave anything; a plain run is two
// such processes side by side (shard_test.go, testkit/shard). The informer-cache
// mutation detector is on: the reconciler reads pods and slices without copies.
func TestMain(m *testing.M) {
	controlplane.DetectCacheMutations()
	if code, ran := shard.Run(shardEnv, controllerTests); ran {
		os.Exit(code)
	}
	cluster.Main(m, cluster.Options{
		KubeProxy: true,
		Nodes:     []cluster.Node{{Name: "node-a", Zone: "zone-a"}, {Name: "node-b", Zone: "zone-b"}},
	}, &shared)
}

// testCluster returns the shared cluster, started by the first test that needs it; it skips the
// test without root.
func testCluster(t testing.TB) *cluster.Cluster {
	t.Helper()
	return shared.Get(t)
}

// runningAgent is an agent started in this process for one node.
type runningAgent struct {
	*agent.Agent
	node   string
	cancel context.CancelFunc
	done   chan error
}

type agentOpt func(*agent.Options)

func withRunner(r scheduler.Runner) agentOpt { return func(o *agent.Options) { o.Runner = r } }
func withWindow(d time.Duration) agentOpt    { return func(o *agent.Options) { o.CoalesceWindow = d } }
func withBurst(n int) agentOpt               { return func(o *agent.Options) { o.CoalesceBurst = n } }

// startAgent starts an agent for node with the real prober (unless a runner is given); it
// stops at the end of the test at the latest.
func startAgent(t testing.TB, c *cluster.Cluster, node string, opts ...agentOpt) *runningAgent {
	t.Helper()
	o := agent.Options{
		NodeName:               node,
		Config:                 c.Env.Config,
		MetricsBindAddress:     "0",
		HealthProbeBindAddress: "0",
		Registry:               prometheus.NewRegistry(),
		SkipNameValidation:     true,
	}
	for _, f := range opts {
		f(&o)
	}
	a, err := agent.New(o)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ra := &runningAgent{Agent: a, node: node, cancel: cancel, done: make(chan error, 1)}
	go func() { ra.done <- a.Run(ctx) }()
	t.Cleanup(ra.stop)
	return ra
}

func (a *runningAgent) stop() { stopAll(a) }

// stopAll stops the agents at once: every one is told to stop before the first is waited for,
// so that none outlives another by the time a shutdown takes (probes in flight, the manager's
// runnables): agents stopped one by one could go stale one at a time.
func stopAll(agents ...*runningAgent) {
	for _, a := range agents {
		if a.cancel != nil {
			a.cancel()
		}
	}
	for _, a := range agents {
		if a.cancel != nil {
			<-a.done
			a.cancel = nil
		}
	}
}

// waitSettled waits until the agent's two HTTP targets have reached their decisive results (one
// passed, one failed: the transitions that make it reconcile) and then until it has run four
// more probes, ample time for a write that reconcile would make; it returns the probe runs at
// the decisive results.
func (a *runningAgent) waitSettled(t *testing.T) float64 {
	t.Helper()
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(a.Metrics.ProbeTransitions.WithLabelValues("HTTP", "Pass")) == 1 &&
			testutil.ToFloat64(a.Metrics.ProbeTransitions.WithLabelValues("HTTP", "Fail")) == 1
	}, time.Minute, 50*time.Millisecond)
	runs := a.probeRuns()
	require.Eventually(t, func() bool { return a.probeRuns() >= runs+4 }, time.Minute, 50*time.Millisecond)
	return runs
}

// probeRuns is how many probes the agent has run.
func (a *runningAgent) probeRuns() float64 {
	n := 0.0
	for _, mode := range []v1alpha1.ProbeMode{v1alpha1.ProbeModeHTTP, v1alpha1.ProbeModeTCP, v1alpha1.ProbeModePostgreSQL, v1alpha1.ProbeModeGRPC} {
		for _, o := range []string{metrics.OutcomeSuccess, metrics.OutcomeFailure, metrics.OutcomeError} {
			n += testutil.ToFloat64(a.Metrics.ProbeResults.WithLabelValues(string(mode), o))
		}
	}
	return n
}

func namedPort(name string, port int32, target intstr.IntOrString) v1alpha1.ServicePort {
	return v1alpha1.ServicePort{Name: name, Port: port, Protocol: corev1.ProtocolTCP, TargetPort: target}
}

func httpProbe(port intstr.IntOrString, success, failure int32) v1alpha1.Probe {
	return v1alpha1.Probe{Mode: v1alpha1.ProbeModeHTTP, TimeoutSeconds: 1, SuccessThreshold: success, FailureThreshold: failure,
		HTTP: &v1alpha1.HTTPProbe{TargetPort: port, Path: "/", Method: "GET", Scheme: corev1.URISchemeHTTP}}
}

func tcpProbe(port intstr.IntOrString, success, failure int32) v1alpha1.Probe {
	return v1alpha1.Probe{Mode: v1alpha1.ProbeModeTCP, TimeoutSeconds: 1, SuccessThreshold: success, FailureThreshold: failure,
		TCP: &v1alpha1.TCPProbe{TargetPort: port}}
}

// createResource creates a ServiceWithHealthchecks (probes every second, from pod start) and,
// standing in for the controller, its child Service with an empty selector and the status that
// says the Service is the resource's own.
func createResource(t *testing.T, c *cluster.Cluster, ns, name string, selector map[string]string, ports []v1alpha1.ServicePort, probes ...v1alpha1.Probe) *v1alpha1.ServiceWithHealthchecks {
	t.Helper()
	return createProbedResource(t, c, ns, name, selector, 1, ports, probes...)
}

// createProbedResource is createResource with a period of one's choosing (a probe's
// timeoutSeconds may not exceed the period) and for benchmarks too.
func createProbedResource(tb testing.TB, c *cluster.Cluster, ns, name string, selector map[string]string, period int32, ports []v1alpha1.ServicePort, probes ...v1alpha1.Probe) *v1alpha1.ServiceWithHealthchecks {
	tb.Helper()
	swh := &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Ports:       ports,
			Selector:    selector,
			Type:        corev1.ServiceTypeClusterIP,
			Healthcheck: &v1alpha1.Healthcheck{InitialDelaySeconds: 0, PeriodSeconds: period, Probes: probes},
		},
	}
	require.NoError(tb, c.Env.Client.Create(tb.Context(), swh))
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference(name, swh.UID)}}}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: p.Name, Port: p.Port, Protocol: p.Protocol, TargetPort: p.TargetPort})
	}
	require.NoError(tb, c.Env.Client.Create(tb.Context(), svc))
	// Standing in for the controller, which reports the Service as the resource's own
	// (status.clusterIP; agents that gate publishing on it publish only then).
	swh.Status.ClusterIP = svc.Spec.ClusterIP
	require.NoError(tb, c.Env.Client.Status().Update(tb.Context(), swh))
	return swh
}

// sliceView is what the tests assert of a slice.
type sliceView struct {
	Port      int32
	PortName  string
	Endpoints map[string]string // pod IP -> "RST" conditions as T/F, e.g. "TTF"
	Pods      map[string]string // pod IP -> pod name
	Nodes     map[string]string // pod IP -> nodeName
	Zones     map[string]string // pod IP -> zone
	RV        string
}

func tf(b *bool) string {
	switch {
	case b == nil:
		return "?"
	case *b:
		return "T"
	}
	return "F"
}

// slicesOf reads the slices of a resource, by name.
func slicesOf(ctx context.Context, c *cluster.Cluster, ns, resource string) (map[string]sliceView, error) {
	var list discoveryv1.EndpointSliceList
	if err := c.Env.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{wellknown.LabelResource: resource}); err != nil {
		return nil, err
	}
	out := map[string]sliceView{}
	for _, s := range list.Items {
		v := sliceView{Endpoints: map[string]string{}, Pods: map[string]string{}, Nodes: map[string]string{}, Zones: map[string]string{}, RV: s.ResourceVersion}
		if len(s.Ports) == 1 {
			v.Port = *s.Ports[0].Port
			v.PortName = *s.Ports[0].Name
		}
		for _, e := range s.Endpoints {
			ip := e.Addresses[0]
			v.Endpoints[ip] = tf(e.Conditions.Ready) + tf(e.Conditions.Serving) + tf(e.Conditions.Terminating)
			if e.TargetRef != nil {
				v.Pods[ip] = e.TargetRef.Name
			}
			if e.NodeName != nil {
				v.Nodes[ip] = *e.NodeName
			}
			if e.Zone != nil {
				v.Zones[ip] = *e.Zone
			}
		}
		out[s.Name] = v
	}
	return out, nil
}

// eventuallySlices waits until the endpoints ("ip" -> "RST") of each named slice are as given
// and no other slice of the resource exists, then returns the slices.
func eventuallySlices(t *testing.T, c *cluster.Cluster, ns, resource string, want map[string]map[string]string) map[string]sliceView {
	t.Helper()
	var got map[string]sliceView
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		var err error
		got, err = slicesOf(t.Context(), c, ns, resource)
		require.NoError(ct, err)
		view := map[string]map[string]string{}
		for name, s := range got {
			view[name] = s.Endpoints
		}
		assert.Equal(ct, want, view)
	}, 60*time.Second, 50*time.Millisecond)
	return got
}

func ip(p *cluster.Pod) string { return p.IP.String() }

// sliceWatch records every change of the EndpointSlices of a namespace.
type sliceWatch struct {
	mu     sync.Mutex
	events []string
	stop   func()
}

func watchSlices(t *testing.T, c *cluster.Cluster, ns string) *sliceWatch {
	t.Helper()
	wc, err := client.NewWithWatch(c.Env.Config, client.Options{Scheme: c.Env.Scheme})
	require.NoError(t, err)
	var list discoveryv1.EndpointSliceList
	require.NoError(t, c.Env.Client.List(t.Context(), &list, client.InNamespace(ns)))
	w, err := wc.Watch(t.Context(), &discoveryv1.EndpointSliceList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	require.NoError(t, err)
	sw := &sliceWatch{stop: w.Stop}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			s, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok || ev.Type == watch.Bookmark {
				continue
			}
			sw.mu.Lock()
			sw.events = append(sw.events, string(ev.Type)+" "+s.Name)
			sw.mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return sw
}

func (w *sliceWatch) Events() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := append([]string(nil), w.events...)
	sort.Strings(out)
	return out
}
