// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package dualstack_test

import (
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// Timing of the scenarios, as in tests/e2e/traffic: probes every second, a port flips after
// failureThreshold failures.
const (
	periodSeconds    = 1
	failureThreshold = 2
	// minInWindow is the fewest requests each loop must send inside a scenario's window.
	minInWindow = 50
	// waitFor bounds every wait for a published state.
	waitFor = time.Minute
	poll    = 50 * time.Millisecond
	// loopFor bounds every background loop; the tests stop theirs long before.
	loopFor = 10 * time.Minute
)

// kit holds the shared e2e helpers with this suite's timing.
var kit = e2e.Timing{
	PeriodSeconds: periodSeconds, FailureThreshold: failureThreshold, MinInWindow: minInWindow, WaitFor: waitFor, Poll: poll,
}

var (
	v4, v6   = corev1.IPv4Protocol, corev1.IPv6Protocol
	both     = []corev1.IPFamily{v4, v6}
	v4only   = []corev1.IPFamily{v4}
	v6only   = []corev1.IPFamily{v6}
	webPorts = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}
	vmPorts  = []corev1.ContainerPort{
		{Name: "web", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
		{Name: "smtp", ContainerPort: 2525, Protocol: corev1.ProtocolTCP},
	}
)

// requireDualStack makes swh ipFamilyPolicy: RequireDualStack.
func requireDualStack(swh *v1alpha1.ServiceWithHealthchecks) *v1alpha1.ServiceWithHealthchecks {
	p := corev1.IPFamilyPolicyRequireDualStack
	swh.Spec.IPFamilyPolicy = &p
	return swh
}

// createResource creates the resource and waits until the controller has made its Service with
// a ClusterIP of each of the families.
func createResource(t *testing.T, c *cluster.Cluster, swh *v1alpha1.ServiceWithHealthchecks, families []corev1.IPFamily) {
	t.Helper()
	require.NoError(t, c.Env.Client.Create(t.Context(), swh))
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		svc := &corev1.Service{}
		require.NoError(ct, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(swh), svc))
		assert.Equal(ct, families, svc.Spec.IPFamilies)
		assert.Len(ct, svc.Spec.ClusterIPs, len(families))
		assert.Empty(ct, svc.Spec.Selector)
	}, waitFor, poll, "the controller creates the Service of %s with families %v", swh.Name, families)
}

// addr is the pod's address of the family.
func addr(t testing.TB, p *cluster.Pod, family corev1.IPFamily) string {
	t.Helper()
	a, ok := p.IPOf(family)
	require.True(t, ok, "pod %s has a %s address", p.Key(), family)
	return a.String()
}

// eventuallyEndpoints waits until the resource's slices are exactly want (slice name ->
// address -> "RST"), and checks that every slice's address type matches its addresses.
func eventuallyEndpoints(t *testing.T, c *cluster.Cluster, ns, resource string, want map[string]map[string]string) map[string]discoveryv1.EndpointSlice {
	t.Helper()
	var last map[string]discoveryv1.EndpointSlice
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		got, byName, err := e2e.SlicesOf(t.Context(), c, ns, resource)
		require.NoError(ct, err)
		assert.Equal(ct, want, got)
		last = byName
	}, waitFor, poll, "the slices of %s/%s", ns, resource)
	for name, s := range last {
		for _, e := range s.Endpoints {
			isV6 := len(e.Addresses) > 0 && strings.Contains(e.Addresses[0], ":")
			assert.Equal(t, isV6, s.AddressType == discoveryv1.AddressTypeIPv6, "slice %s (%s) lists %v", name, s.AddressType, e.Addresses)
		}
	}
	return last
}

// eventuallyStatus waits until the resource's ready summary is summary and its
// EndpointsAvailable condition has the status and message.
func eventuallyStatus(t *testing.T, c *cluster.Cluster, ns, name, summary string, available metav1.ConditionStatus, message string) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		swh := &v1alpha1.ServiceWithHealthchecks{}
		require.NoError(ct, c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, swh))
		assert.Equal(ct, summary, swh.Status.ReadySummary)
		cond := meta.FindStatusCondition(swh.Status.Conditions, v1alpha1.ConditionEndpointsAvailable)
		require.NotNil(ct, cond)
		assert.Equal(ct, available, cond.Status)
		assert.Equal(ct, message, cond.Message)
	}, waitFor, poll, "the status of %s/%s", ns, name)
}

// loops are request loops through the ClusterIPs of a Service, one per family, started together.
type loops struct {
	service string
	byFam   map[corev1.IPFamily]*cluster.Traffic
}

// startLoops starts a background loop through the Service's ClusterIP of each family.
func startLoops(t *testing.T, c *cluster.Cluster, service string, port int32, proto cluster.Protocol, families []corev1.IPFamily) *loops {
	t.Helper()
	l := &loops{service: service, byFam: map[corev1.IPFamily]*cluster.Traffic{}}
	for _, f := range families {
		ip, err := c.ClusterIPOf(t.Context(), service, f)
		require.NoError(t, err)
		l.byFam[f] = c.Traffic(t, cluster.TrafficOptions{Address: ip, Port: port, Protocol: proto, Duration: loopFor})
	}
	return l
}

// waitAfter waits until every loop has sent minInWindow requests that started after t.
func (l *loops) waitAfter(t *testing.T, after time.Time) {
	t.Helper()
	for f, tr := range l.byFam {
		require.Eventually(t, func() bool { return len(tr.Results().Since(after)) >= minInWindow }, waitFor, poll,
			"%d %s requests to %s after %s", minInWindow, f, l.service, after.Format("15:04:05.000"))
	}
}

// stop ends the loops and returns their results by family.
func (l *loops) stop() map[corev1.IPFamily]cluster.Results {
	out := map[corev1.IPFamily]cluster.Results{}
	for f, tr := range l.byFam {
		out[f] = tr.Stop()
	}
	return out
}

// requireNoFailure asserts zero failed requests in every family's window [from, to] and that
// exactly the pods want[family] answered there; it logs and returns the figures.
func requireNoFailure(t *testing.T, scenario string, res map[corev1.IPFamily]cluster.Results, from, to time.Time, want map[corev1.IPFamily][]string) {
	t.Helper()
	fams := make([]string, 0, len(res))
	for f := range res {
		fams = append(fams, string(f))
	}
	sort.Strings(fams)
	for _, fs := range fams {
		f := corev1.IPFamily(fs)
		window := kit.RequireWindow(t, res[f], scenario+" over "+fs, from, to)
		assert.Empty(t, res[f].Failed(), "%s over %s: %s; failed: %s", scenario, fs, res[f], e2e.Failures(res[f]))
		if pods, ok := want[f]; ok {
			sort.Strings(pods)
			assert.Equal(t, pods, window.Pods(), "%s over %s: the pods that answered in the window", scenario, fs)
		}
		t.Logf("FIGURES scenario=%q family=%s requests=%d failed=%d window_requests=%d window_failed=%d",
			scenario, fs, len(res[f]), len(res[f].Failed()), len(window), len(window.Failed()))
	}
}

// keys are the pods' keys.
func keys(pods ...*cluster.Pod) []string {
	out := make([]string, 0, len(pods))
	for _, p := range pods {
		out = append(out, p.Key())
	}
	return out
}
