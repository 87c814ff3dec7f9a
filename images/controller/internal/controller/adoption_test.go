// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/childservice"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/metrics"
)

// liveService is a Service as a user would have it before migrating: a selector, node ports and
// the adopt annotation.
func liveService(ns string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web", Namespace: ns,
			Labels:      map[string]string{"app": "web"},
			Annotations: map[string]string{wellknown.AnnotationAdopt: "true"},
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

// builtinSlice creates an EndpointSlice of Service svc as the built-in EndpointSlice controller
// publishes it (service-name label, its managed-by value, the Service as controlling owner);
// change makes it someone else's.
func builtinSlice(t *testing.T, svc *corev1.Service, name string, change func(*discoveryv1.EndpointSlice)) *discoveryv1.EndpointSlice {
	t.Helper()
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: svc.Namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: BuiltinManagedBy},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"10.1.0.5"},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
	if change != nil {
		change(s)
	}
	create(t, s)
	return s
}

// notReady publishes the slice's endpoint as the agent does while the probes fail.
func notReady(s *discoveryv1.EndpointSlice) {
	s.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
}

func exists(t *testing.T, obj client.Object) bool {
	t.Helper()
	err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object))
	if apierrors.IsNotFound(err) {
		return false
	}
	require.NoError(t, err)
	return true
}

func TestAdoptionKeepsTheSelectorUntilEveryPortHasAReadyEndpoint(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "adopt")
	run := startController(t, ns, nil)

	// A pod the Service selects: the built-in endpoints keep serving until ours are ready.
	create(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: ns, Labels: map[string]string{"app": "web"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "web"}}},
	})
	live := liveService(ns)
	create(t, live)
	nodePorts := []int32{live.Spec.Ports[0].NodePort, live.Spec.Ports[1].NodePort}
	require.NotZero(t, nodePorts[0])

	// The built-in controller's slices of the Service (two address families), and slices that
	// look alike but are not the built-in controller's slices of this Service.
	builtin := []*discoveryv1.EndpointSlice{
		builtinSlice(t, live, "web-builtin4", nil),
		builtinSlice(t, live, "web-builtin6", func(s *discoveryv1.EndpointSlice) {
			s.AddressType = discoveryv1.AddressTypeIPv6
			s.Endpoints[0].Addresses = []string{"fd00::5"}
		}),
	}
	foreign := []*discoveryv1.EndpointSlice{
		builtinSlice(t, live, "web-other-manager", func(s *discoveryv1.EndpointSlice) {
			s.Labels[discoveryv1.LabelManagedBy] = "other-controller.example.com"
		}),
		builtinSlice(t, live, "web-other-owner", func(s *discoveryv1.EndpointSlice) {
			s.OwnerReferences[0].UID = "0b3e6a52-0000-4000-8000-000000000000"
		}),
		builtinSlice(t, live, "web-no-owner", func(s *discoveryv1.EndpointSlice) { s.OwnerReferences = nil }),
	}

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
	// The counter is incremented after the write returns: the owner reference can be seen first.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, 1.0, testutil.ToFloat64(run.metrics.Adoptions))
	}, wait, tick, "the adoption is counted")

	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		cond := condition(swh, v1alpha1.ConditionServiceSynced)
		assert.Equal(c, childservice.ReasonSelectorPending, cond.Reason)
		assert.Contains(c, cond.Message, "adopting: waiting for a ready endpoint on port(s) http, metrics;")
		assert.Equal(c, live.Spec.ClusterIP, swh.Status.ClusterIP)
	}, "the status says the selector waits for both ports")

	// Our slices exist for every port, but no endpoint in them is ready yet.
	node(t, ns+"-n1")
	httpSlice := slice(t, ns, "web", swh.UID, "http", ns+"-n1", notReady)
	metricsSlice := slice(t, ns, "web", swh.UID, "metrics", ns+"-n1", notReady)
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		if assert.Len(c, swh.Status.Ports, 2) {
			for _, p := range swh.Status.Ports {
				assert.Equal(c, int32(1), p.TotalEndpoints, "the controller has seen the slice of port %s", p.Name)
			}
		}
		cond := condition(swh, v1alpha1.ConditionServiceSynced)
		assert.Equal(c, childservice.ReasonSelectorPending, cond.Reason)
		assert.Contains(c, cond.Message, "port(s) http, metrics;")
	}, "slices without a ready endpoint are seen, and both ports still wait")
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(svc), svc))
	assert.Equal(t, map[string]string{"app": "web"}, svc.Spec.Selector, "slices without a ready endpoint are not enough")
	for _, s := range builtin {
		assert.True(t, exists(t, s), "the built-in slice %s stays while the selector does", s.Name)
	}

	setReady(t, httpSlice, "10.1.0.5", true)
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		cond := condition(swh, v1alpha1.ConditionServiceSynced)
		assert.Equal(c, childservice.ReasonSelectorPending, cond.Reason)
		assert.Contains(c, cond.Message, "port(s) metrics;")
	}, "the ready endpoint of one port was seen; the other port still waits")
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(svc), svc))
	assert.Equal(t, map[string]string{"app": "web"}, svc.Spec.Selector, "one port's ready endpoint is not enough")

	setReady(t, metricsSlice, "10.1.0.5", true)
	svc = eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.Empty(c, svc.Spec.Selector)
	}, "the selector is cleared once every port has a ready endpoint")
	assert.Equal(t, live.Spec.ClusterIP, svc.Spec.ClusterIP, "the cluster IP is still kept")
	assert.Equal(t, nodePorts, []int32{svc.Spec.Ports[0].NodePort, svc.Spec.Ports[1].NodePort}, "the node ports are still kept")
	for _, s := range builtin {
		gone(t, s, "the built-in slice "+s.Name+" is deleted once the selector is cleared")
	}
	require.Eventually(t, func() bool { return testutil.ToFloat64(run.metrics.BuiltinSlicesDeleted) == 2 }, wait, tick,
		"both deletions are counted")
	for _, s := range foreign {
		assert.True(t, exists(t, s), "%s is not the built-in controller's slice of this Service and stays", s.Name)
	}
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
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		if ev := eventsAbout(t, ns, "web", eventBuiltinSlicesDeleted); assert.Len(c, ev, 1) {
			assert.Contains(c, ev[0].Note, "web-builtin4, web-builtin6")
		}
	}, wait, tick, "an Event names the deleted built-in slices")
	assert.Equal(t, 0.0, testutil.ToFloat64(run.metrics.Errors.WithLabelValues(metrics.OpDeleteBuiltinSlice)))
}

// A controller that stopped between clearing the selector and deleting the built-in slices (or
// an earlier version that did not delete them) leaves them; the next controller deletes them.
func TestAControllerStartedAfterTheSelectorWasClearedDeletesTheBuiltinSlices(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "adoptr")
	first := startController(t, ns, nil)
	live := liveService(ns)
	create(t, live)
	swh := newResource(ns, "web", func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Type = corev1.ServiceTypeNodePort })
	create(t, swh)
	eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.Len(c, svc.OwnerReferences, 1)
		assert.Empty(c, svc.Spec.Selector)
	}, "the Service is adopted and its selector (which selects no pod) cleared")
	first.stop()

	left := builtinSlice(t, live, "web-left", nil)
	other := builtinSlice(t, live, "web-other-manager", func(s *discoveryv1.EndpointSlice) {
		s.Labels[discoveryv1.LabelManagedBy] = "other-controller.example.com"
	})
	second := startController(t, ns, nil)
	gone(t, left, "the restarted controller deletes the built-in slice left over")
	require.Eventually(t, func() bool { return testutil.ToFloat64(second.metrics.BuiltinSlicesDeleted) == 1 }, wait, tick,
		"the deletion is counted by the restarted controller")
	assert.True(t, exists(t, other), "a slice of another manager stays")
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
