package controller

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/childservice"
)

// liveService is a Service as a user would have it before migrating: a selector, node ports and
// the adopt annotation.
func liveService(ns string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web", Namespace: ns,
			Labels:      map[string]string{"app": "web"},
			Annotations: map[string]string{slicemeta.AnnotationAdopt: "true"},
		},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
				{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9090},
			},
		},
	}
}

func TestAdoptionKeepsTheSelectorUntilEveryPortHasSlices(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "adopt")
	run := startController(t, ns, nil)

	// A pod the Service selects: the built-in endpoints keep serving until ours exist.
	create(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: ns, Labels: map[string]string{"app": "web"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "web"}}},
	})
	live := liveService(ns)
	create(t, live)
	nodePorts := []int32{live.Spec.Ports[0].NodePort, live.Spec.Ports[1].NodePort}
	require.NotZero(t, nodePorts[0])

	swh := newResource(ns, "web", func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Type = corev1.ServiceTypeNodePort })
	create(t, swh)

	svc := eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
		if assert.Len(c, svc.OwnerReferences, 1) {
			assert.Equal(c, swh.UID, svc.OwnerReferences[0].UID)
		}
	}, "the Service is adopted")
	assert.Equal(t, live.Spec.ClusterIP, svc.Spec.ClusterIP, "the cluster IP is kept")
	assert.Equal(t, nodePorts, []int32{svc.Spec.Ports[0].NodePort, svc.Spec.Ports[1].NodePort}, "the node ports are kept")
	assert.Equal(t, map[string]string{"app": "web"}, svc.Spec.Selector, "the selector stays while no slice exists")
	assert.Equal(t, 1.0, testutil.ToFloat64(run.metrics.Adoptions))

	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		cond := condition(swh, v1alpha1.ConditionServiceSynced)
		assert.Equal(c, childservice.ReasonSelectorPending, cond.Reason)
		assert.Contains(c, cond.Message, "http, metrics")
		assert.Equal(c, live.Spec.ClusterIP, swh.Status.ClusterIP)
	}, "the status says the selector waits for slices of both ports")

	node(t, ns+"-n1")
	slice(t, ns, "web", swh.UID, "http", ns+"-n1")
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		cond := condition(swh, v1alpha1.ConditionServiceSynced)
		assert.Equal(c, childservice.ReasonSelectorPending, cond.Reason)
		assert.NotContains(c, cond.Message, "http")
		assert.Contains(c, cond.Message, "metrics")
	}, "the slice of one port was seen; the other port still waits")
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(svc), svc))
	assert.Equal(t, map[string]string{"app": "web"}, svc.Spec.Selector, "one port's slices are not enough")

	slice(t, ns, "web", swh.UID, "metrics", ns+"-n1")
	svc = eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.Empty(c, svc.Spec.Selector)
	}, "the selector is cleared once every port has slices")
	assert.Equal(t, live.Spec.ClusterIP, svc.Spec.ClusterIP, "the cluster IP is still kept")
	assert.Equal(t, nodePorts, []int32{svc.Spec.Ports[0].NodePort, svc.Spec.Ports[1].NodePort}, "the node ports are still kept")
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		cond := condition(swh, v1alpha1.ConditionServiceSynced)
		assert.Equal(c, metav1.ConditionTrue, cond.Status)
		assert.Equal(c, childservice.ReasonSynced, cond.Reason)
	}, "the adopted Service is in sync")
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(svc), svc))
	for _, f := range svc.ManagedFields {
		if f.Manager == childservice.FieldManager {
			assert.Equal(t, metav1.ManagedFieldsOperationApply, f.Operation,
				"the controller owns fields only through apply, so later applies can remove them")
		}
	}
	assert.Len(t, eventsAbout(t, ns, "web", "Adopted"), 1)
	assert.Len(t, eventsAbout(t, ns, "web", "SelectorCleared"), 1)
}

func TestAdoptionClearsTheSelectorAtOnceWhenItSelectsNoPod(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "adopt0")
	startController(t, ns, nil)
	live := liveService(ns)
	create(t, live)

	swh := newResource(ns, "web", func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Type = corev1.ServiceTypeNodePort })
	create(t, swh)
	svc := eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.Len(c, svc.OwnerReferences, 1)
		assert.Empty(c, svc.Spec.Selector)
	}, "the Service is adopted and its selector cleared")
	assert.Equal(t, live.Spec.ClusterIP, svc.Spec.ClusterIP)
	assert.Equal(t, live.Spec.Ports[0].NodePort, svc.Spec.Ports[0].NodePort)
}

func TestAdoptionKeepsTheSelectorWhileTheServiceHasPortsTheResourceLacks(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "adoptx")
	startController(t, ns, nil)
	live := liveService(ns)
	live.Spec.Ports = append(live.Spec.Ports, corev1.ServicePort{Name: "admin", Protocol: corev1.ProtocolTCP, Port: 8443})
	create(t, live)

	swh := newResource(ns, "web", func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Type = corev1.ServiceTypeNodePort })
	create(t, swh)
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		cond := condition(swh, v1alpha1.ConditionServiceSynced)
		assert.Equal(c, childservice.ReasonExtraPorts, cond.Reason)
		assert.Contains(c, cond.Message, "8443/TCP")
	}, "the status names the port the resource lacks")
	svc := service(ns, "web")
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(svc), svc))
	assert.Len(t, svc.OwnerReferences, 1, "the Service is adopted")
	assert.NotEmpty(t, svc.Spec.Selector, "the selector is kept: traffic to the extra port would fail without it")
	assert.Len(t, svc.Spec.Ports, 3, "the extra port is not removed")

	update(t, svc, func(svc *corev1.Service) { svc.Spec.Ports = svc.Spec.Ports[:2] })
	eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.Empty(c, svc.Spec.Selector)
	}, "once the user removes the port, the selector (which selects no pod) is cleared")
}
