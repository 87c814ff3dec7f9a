// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package e2e holds the helpers the end-to-end suites of the tests module (tests/e2e/traffic,
// tests/e2e/lb, tests/e2e/dualstack) share: building resources, reading the published
// EndpointSlices, the zero-failure windows of request loops, and the restart and leader-change
// steps of the stack. Each suite keeps its own timing (how long to wait, how often to poll,
// how many requests make a window) in a Timing; the helpers assert exactly what each suite's
// own copy asserted before.
package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/metrics"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

// Timing is one suite's timing: the probes of its resources and the bounds of its waits. The
// suites differ (tests/e2e/lb polls every 20 ms, the others every 50 ms), so each passes its own.
type Timing struct {
	// PeriodSeconds of every resource the suite builds.
	PeriodSeconds int32
	// FailureThreshold of every probe the suite builds.
	FailureThreshold int32
	// MinInWindow is the fewest requests a loop must send inside the window of an event.
	MinInWindow int
	// WaitFor bounds every wait for a published state.
	WaitFor time.Duration
	// Poll is the polling interval of those waits.
	Poll time.Duration
}

// ServicePort is a TCP port of a resource.
func ServicePort(name string, port int32, target intstr.IntOrString) v1alpha1.ServicePort {
	return v1alpha1.ServicePort{Name: name, Port: port, Protocol: corev1.ProtocolTCP, TargetPort: target}
}

// HTTPProbe is a GET /healthz probe of the port with a one-second timeout.
func (tm Timing) HTTPProbe(port intstr.IntOrString) v1alpha1.Probe {
	return v1alpha1.Probe{
		Mode: v1alpha1.ProbeModeHTTP, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: tm.FailureThreshold,
		HTTP: &v1alpha1.HTTPProbe{TargetPort: port, Path: "/healthz", Method: "GET", Scheme: corev1.URISchemeHTTP},
	}
}

// TCPProbe is a TCP connect probe of the port with a one-second timeout.
func (tm Timing) TCPProbe(port intstr.IntOrString) v1alpha1.Probe {
	return v1alpha1.Probe{
		Mode: v1alpha1.ProbeModeTCP, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: tm.FailureThreshold,
		TCP: &v1alpha1.TCPProbe{TargetPort: port},
	}
}

// Resource is a ClusterIP ServiceWithHealthchecks whose probes run every PeriodSeconds from pod
// start.
func (tm Timing) Resource(ns, name string, selector map[string]string, ports []v1alpha1.ServicePort, probes ...v1alpha1.Probe) *v1alpha1.ServiceWithHealthchecks {
	return &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Ports:       ports,
			Selector:    selector,
			Type:        corev1.ServiceTypeClusterIP,
			Healthcheck: &v1alpha1.Healthcheck{InitialDelaySeconds: 0, PeriodSeconds: tm.PeriodSeconds, Probes: probes},
		},
	}
}

// Conds renders endpoint conditions as three letters ready, serving, terminating: "TTF" ("?"
// for an unset one).
func Conds(c discoveryv1.EndpointConditions) string {
	tf := func(b *bool) string {
		switch {
		case b == nil:
			return "?"
		case *b:
			return "T"
		}
		return "F"
	}
	return tf(c.Ready) + tf(c.Serving) + tf(c.Terminating)
}

// SliceEndpoints is a slice's endpoints as first address -> "RST" conditions.
func SliceEndpoints(s *discoveryv1.EndpointSlice) map[string]string {
	eps := map[string]string{}
	for _, e := range s.Endpoints {
		eps[e.Addresses[0]] = Conds(e.Conditions)
	}
	return eps
}

// SlicesOf reads a resource's slices (by the module's resource label) as slice name ->
// endpoint address -> conditions, and the slices themselves by name.
func SlicesOf(ctx context.Context, c *cluster.Cluster, ns, resource string) (map[string]map[string]string, map[string]discoveryv1.EndpointSlice, error) {
	var list discoveryv1.EndpointSliceList
	if err := c.Env.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{wellknown.LabelResource: resource}); err != nil {
		return nil, nil, fmt.Errorf("listing the slices of %s/%s: %w", ns, resource, err)
	}
	out := map[string]map[string]string{}
	byName := map[string]discoveryv1.EndpointSlice{}
	for _, s := range list.Items {
		out[s.Name] = SliceEndpoints(&s)
		byName[s.Name] = s
	}
	return out, byName, nil
}

// EndpointsOf is SlicesOf without the slices.
func EndpointsOf(ctx context.Context, c *cluster.Cluster, ns, resource string) (map[string]map[string]string, error) {
	out, _, err := SlicesOf(ctx, c, ns, resource)
	return out, err
}

// EventuallyEndpoints waits until the resource's slices are exactly want (slice name ->
// address -> "RST" conditions).
func (tm Timing) EventuallyEndpoints(t testing.TB, c *cluster.Cluster, ns, resource string, want map[string]map[string]string) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		got, err := EndpointsOf(t.Context(), c, ns, resource)
		require.NoError(ct, err)
		assert.Equal(ct, want, got)
	}, tm.WaitFor, tm.Poll, "the slices of %s/%s", ns, resource)
}

// RequireWindow asserts that the loop spanned the event window [from, to] — it sent requests
// before from and after to — and sent at least MinInWindow requests inside it; it returns the
// window's requests.
func (tm Timing) RequireWindow(t *testing.T, res cluster.Results, name string, from, to time.Time) cluster.Results {
	t.Helper()
	require.False(t, to.Before(from), "%s: the window ends before it starts", name)
	require.NotEmpty(t, res.Before(from), "%s: the loop started before the window (%s)", name, from.Format(time.RFC3339Nano))
	require.NotEmpty(t, res.Since(to), "%s: the loop went on after the window (%s)", name, to.Format(time.RFC3339Nano))
	in := res.Since(from).Before(to)
	require.GreaterOrEqual(t, len(in), tm.MinInWindow, "%s: requests inside the window %s..%s", name,
		from.Format("15:04:05.000"), to.Format("15:04:05.000"))
	return in
}

// Failures summarises failed requests for an assertion message: how many, their span, the
// first error.
func Failures(r cluster.Results) string {
	f := r.Failed()
	if len(f) == 0 {
		return "none"
	}
	return fmt.Sprintf("%d failed from %s to %s, first: %s", len(f),
		f[0].Start.Format("15:04:05.000"), f[len(f)-1].Start.Format("15:04:05.000"), f[0].Err)
}

// WaitRequestsAfter waits until the loop has sent n requests that started after t, so a window
// closes only once enough traffic went through it.
func (tm Timing) WaitRequestsAfter(tb testing.TB, tr *cluster.Traffic, after time.Time, n int) {
	tb.Helper()
	require.Eventually(tb, func() bool { return len(tr.Results().Since(after)) >= n }, tm.WaitFor, tm.Poll,
		"%d requests after %s", n, after.Format("15:04:05.000"))
}

// ScrapeSum reads a program's /metrics on addr and sums every sample of the metric name (all
// label sets; 0 when it has none).
func ScrapeSum(ctx context.Context, addr, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	fams, err := metrics.Get(ctx, addr)
	if err != nil {
		return 0, err
	}
	return fams.Sum(name, nil), nil
}

// RequireProbedAgain waits until the node's (new) agent has run every probe of its targets
// FailureThreshold+2 times: enough for every endpoint to reach a decisive result and for a
// write that would follow it to have happened.
func (tm Timing) RequireProbedAgain(t *testing.T, s *stack.Stack, node string, targets int) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		n, err := ScrapeSum(t.Context(), s.AgentMetricsAddr(node), "swh_agent_probe_results_total")
		require.NoError(ct, err)
		assert.GreaterOrEqual(ct, n, float64(targets*int(tm.FailureThreshold+2)), "probes run by the new agent of %s", node)
	}, tm.WaitFor, tm.Poll)
}

// RestartAgent restarts the node's agent, asserts that a new process runs it and waits until
// that process has probed each of the node's targets again (RequireProbedAgain).
func (tm Timing) RestartAgent(t *testing.T, s *stack.Stack, node string, targets int) {
	t.Helper()
	pid := s.AgentPID(node)
	require.NoError(t, s.RestartAgent(t.Context(), node))
	assert.NotEqual(t, pid, s.AgentPID(node), "the agent of %s is a new process", node)
	tm.RequireProbedAgain(t, s, node, targets)
}

// ElectionHolder is the holderIdentity of the controllers' leader election Lease.
func ElectionHolder(ctx context.Context, s *stack.Stack) (string, error) {
	var l coordinationv1.Lease
	if err := s.Client().Get(ctx, client.ObjectKey{Namespace: stack.Namespace, Name: stack.LeaderElectionID}, &l); err != nil {
		return "", fmt.Errorf("reading the leader election Lease: %w", err)
	}
	if l.Spec.HolderIdentity == nil {
		return "", nil
	}
	return *l.Spec.HolderIdentity, nil
}

// ChangeLeader restarts the controller leader and waits until the election Lease names another
// replica and that new leader reconciles.
func (tm Timing) ChangeLeader(t *testing.T, s *stack.Stack) {
	t.Helper()
	holder, err := ElectionHolder(t.Context(), s)
	require.NoError(t, err)
	require.NotEmpty(t, holder, "a replica holds the election Lease")
	oldLeader, newLeader, err := s.RestartLeader(t.Context())
	require.NoError(t, err)
	assert.NotEqual(t, oldLeader, newLeader, "another replica leads")
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		now, err := ElectionHolder(t.Context(), s)
		require.NoError(ct, err)
		assert.NotEmpty(ct, now)
		assert.NotEqual(ct, holder, now, "the election Lease names the new leader")
	}, tm.WaitFor, tm.Poll)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		n, err := ScrapeSum(t.Context(), s.ControllerMetricsAddr(newLeader), "swh_controller_reconciles_total")
		require.NoError(ct, err)
		assert.Positive(ct, n, "the new leader reconciles")
	}, tm.WaitFor, tm.Poll)
}

// BuiltInManagedBy is the managed-by value of the built-in EndpointSlice controller.
const BuiltInManagedBy = "endpointslice-controller.k8s.io"

// StartEndpointSliceController runs the real built-in EndpointSlice controller — the
// kube-controller-manager of the pinned Kubernetes (built by tools/) with only
// endpointslice-controller enabled — against the stack's API server until the test ends. The
// envtest API server runs no controllers of its own: without it a Service's selector would
// publish nothing (one slice per family of the Service once it runs).
func StartEndpointSliceController(t *testing.T, s *stack.Stack) {
	t.Helper()
	bin, err := controlplane.Binary("kube-controller-manager")
	require.NoError(t, err)
	cmd := exec.Command(bin, "--kubeconfig="+s.Kubeconfig, "--controllers=endpointslice-controller", //nolint:gosec // the pinned tool binary
		"--leader-elect=false", "--secure-port=0")
	process.StartForTest(t, "kube-controller-manager", cmd)
}
