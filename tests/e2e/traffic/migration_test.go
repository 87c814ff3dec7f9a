// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// builtInEndpoints reads the built-in controller's slices of a Service as address -> "RST".
func builtInEndpoints(ctx context.Context, c *cluster.Cluster, ns, service string) (map[string]string, int, error) {
	var list discoveryv1.EndpointSliceList
	if err := c.Env.Client.List(ctx, &list, client.InNamespace(ns),
		client.MatchingLabels{discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: e2e.BuiltInManagedBy}); err != nil {
		return nil, 0, fmt.Errorf("listing the built-in slices of %s/%s: %w", ns, service, err)
	}
	eps := map[string]string{}
	for _, s := range list.Items {
		for k, v := range e2e.SliceEndpoints(&s) {
			eps[k] = v
		}
	}
	return eps, len(list.Items), nil
}

// liveService is a user's Service with a selector, marked for adoption: the one
// docs/EXAMPLES.md migrates.
func liveService(ns string, selector map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web", Annotations: map[string]string{wellknown.AnnotationAdopt: "true"}},
		Spec: corev1.ServiceSpec{
			Selector: selector,
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

// migrationSetup sets up scenario 6 up to the adoption: two pods behind a live Service whose
// endpoints the real built-in controller publishes, routed by kube-proxy.
func migrationSetup(t *testing.T, s *stack.Stack, ns string) (*corev1.Service, []*cluster.Pod, []*cluster.Server) {
	t.Helper()
	c := s.Cluster
	e2e.StartEndpointSliceController(t, s)
	labels := map[string]string{"app": "web"}
	var pods []*cluster.Pod
	var servers []*cluster.Server
	for _, node := range []string{"node-a", "node-b"} {
		p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-" + node, Node: node, Labels: labels, ContainerPorts: webPorts})
		servers = append(servers, p.ServeHTTP(t, 8080))
		pods = append(pods, p)
	}
	svc := liveService(ns, labels)
	require.NoError(t, c.Env.Client.Create(t.Context(), svc))
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		eps, _, err := builtInEndpoints(t.Context(), c, ns, "web")
		require.NoError(ct, err)
		assert.Equal(ct, map[string]string{ip(pods[0]): "TTF", ip(pods[1]): "TTF"}, eps)
	}, waitFor, poll, "the built-in controller publishes the live Service's pods")
	c.WaitProgrammed(t, ns+"/web", 80, pods...)
	return svc, pods, servers
}

// migratingResource is the ServiceWithHealthchecks that takes the live Service over: same name,
// selector and ports. Its probe needs three passes, so the agents publish a few seconds after
// it is created and the switch happens under the running loop.
func migratingResource(ns string, selector map[string]string) *v1alpha1.ServiceWithHealthchecks {
	probe := kit.HTTPProbe(intstr.FromInt32(8080))
	probe.SuccessThreshold = 3
	return kit.Resource(ns, "web", selector, []v1alpha1.ServicePort{e2e.ServicePort("http", 80, intstr.FromInt32(8080))}, probe)
}

// Scenario 6: migrating a live Service (DESIGN §11). A Service with a selector, served by the
// real built-in EndpointSlice controller and under a request loop, is adopted by a new
// ServiceWithHealthchecks of the same name: the controller takes it over, keeps its ClusterIP,
// and clears its selector once the agents have published every port. Zero failed requests
// from the creation of the resource until the switch is done.
func TestALiveServiceIsAdoptedWithoutAFailedRequest(t *testing.T) {
	s := testStack(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "migrate")
	svc, pods, _ := migrationSetup(t, s, ns)
	clusterIP := svc.Spec.ClusterIP
	require.NotEmpty(t, clusterIP)

	w := watchSlices(t, c, ns)
	loop := c.Traffic(t, cluster.TrafficOptions{Service: ns + "/web", Port: 80, Duration: loopFor})
	logTimelineOnFailure(t, w, loop)
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)
	adopting := time.Now()
	swh := migratingResource(ns, svc.Spec.Selector)
	require.NoError(t, c.Env.Client.Create(t.Context(), swh))
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		got := &corev1.Service{}
		require.NoError(ct, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(svc), got))
		assert.Empty(ct, got.Spec.Selector, "the selector is cleared")
		assert.Equal(ct, []metav1.OwnerReference{slicemeta.OwnerReference("web", swh.UID)}, got.OwnerReferences, "the resource owns the Service")
		cur := &v1alpha1.ServiceWithHealthchecks{}
		require.NoError(ct, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(swh), cur))
		cond := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionServiceSynced)
		require.NotNil(ct, cond)
		assert.Equal(ct, metav1.ConditionTrue, cond.Status, "%s: %s", cond.Reason, cond.Message)
	}, waitFor, poll, "the controller adopts the Service and clears its selector")
	cleared := time.Now()
	kit.EventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-a": {ip(pods[0]): "TTF"},
		"web-http-node-b": {ip(pods[1]): "TTF"},
	})
	c.WaitProgrammed(t, ns+"/web", 80, pods...)
	switched := time.Now()
	kit.WaitRequestsAfter(t, loop, switched, minInWindow)
	res := loop.Stop()

	// The switch ends when the probed endpoints serve: the selector cleared, the agents'
	// slices ready, kube-proxy programmed.
	window := kit.RequireWindow(t, res, "the adoption, from the resource created to the probed endpoints serving", adopting, switched)
	assert.Empty(t, res.Failed(), "requests across the migration: %s; failed: %s", res, e2e.Failures(res))
	assert.ElementsMatch(t, []string{pods[0].Key(), pods[1].Key()}, window.Pods(), "both pods answered during the switch")
	got := &corev1.Service{}
	require.NoError(t, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(svc), got))
	assert.Equal(t, clusterIP, got.Spec.ClusterIP, "the ClusterIP is kept")
	assert.Equal(t, svc.UID, got.UID, "it is the same Service object")
	t.Logf("scenario 6: %d requests from the resource created to the probed endpoints serving (%s; selector cleared after %s), %d failed; %d in the whole loop",
		len(window), switched.Sub(adopting).Round(time.Millisecond), cleared.Sub(adopting).Round(time.Millisecond), len(window.Failed()), len(res))
	record(t, "6 migration of a live Service", res, window)
}

// After the migration the Service routes by the probes alone: a pod whose probe fails gets no
// new connection. This needs the built-in controller's slices gone once the selector is
// cleared (DESIGN §11, development/CONTROLLER.md "Adoption").
func TestAnAdoptedServiceRoutesByItsProbesAlone(t *testing.T) {
	s := testStack(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "migrated")
	svc, pods, servers := migrationSetup(t, s, ns)
	swh := migratingResource(ns, svc.Spec.Selector)
	require.NoError(t, c.Env.Client.Create(t.Context(), swh))
	kit.EventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-a": {ip(pods[0]): "TTF"},
		"web-http-node-b": {ip(pods[1]): "TTF"},
	})
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		got := &corev1.Service{}
		require.NoError(ct, c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(svc), got))
		assert.Empty(ct, got.Spec.Selector, "the selector is cleared")
	}, waitFor, poll)

	servers[1].SetHTTPStatus(503)
	kit.EventuallyEndpoints(t, c, ns, "web", map[string]map[string]string{
		"web-http-node-a": {ip(pods[0]): "TTF"},
		"web-http-node-b": {ip(pods[1]): "FFF"},
	})
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		eps, n, err := builtInEndpoints(t.Context(), c, ns, "web")
		require.NoError(ct, err)
		assert.Zero(ct, n, "no built-in slice is left for the adopted Service (it still lists %v)", eps)
	}, waitFor, poll, "the built-in slices go once the selector is cleared")
	c.WaitProgrammed(t, ns+"/web", 80, pods[0])
	res := c.Requests(t, cluster.TrafficOptions{Service: ns + "/web", Port: 80, Count: minInWindow})
	assert.Equal(t, map[string]int{pods[0].Key(): minInWindow}, res.ByPod(), "only the pod that passes gets requests: %s", res)
}
