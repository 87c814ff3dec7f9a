// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/childservice"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/metrics"
)

func TestChildServiceFollowsTheResource(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "svc")
	startController(t, ns, nil)

	swh := newResource(ns, "web", func(s *v1alpha1.ServiceWithHealthchecks) {
		s.Labels = map[string]string{"team": "web", "tier": "front"}
		s.Annotations = map[string]string{"example.org/owner": "alice", "example.org/keep": "yes"}
	})
	create(t, swh)

	svc := eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.Equal(c, map[string]string{"team": "web", "tier": "front"}, svc.Labels)
	}, "the child Service is created")
	assert.Empty(t, svc.Spec.Selector, "the child Service has no selector")
	require.Len(t, svc.OwnerReferences, 1)
	assert.Equal(t, swh.UID, svc.OwnerReferences[0].UID)
	assert.True(t, *svc.OwnerReferences[0].Controller)
	assert.Equal(t, "alice", svc.Annotations["example.org/owner"])
	assert.Equal(t, corev1.ServiceTypeClusterIP, svc.Spec.Type)
	require.Len(t, svc.Spec.Ports, 2)
	assert.Equal(t, intstr.FromInt32(8080), svc.Spec.Ports[0].TargetPort)
	assert.Equal(t, intstr.FromInt32(9090), svc.Spec.Ports[1].TargetPort)
	assert.NotEmpty(t, svc.Spec.ClusterIP)
	clusterIP := svc.Spec.ClusterIP

	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		cond := condition(swh, v1alpha1.ConditionServiceSynced)
		assert.Equal(c, metav1.ConditionTrue, cond.Status)
		assert.Equal(c, childservice.ReasonSynced, cond.Reason)
		assert.Equal(c, swh.Generation, swh.Status.ObservedGeneration)
		assert.Equal(c, swh.Generation, cond.ObservedGeneration)
		assert.Equal(c, clusterIP, swh.Status.ClusterIP)
	}, "the status reports the Service")
	assert.Len(t, eventsAbout(t, ns, "web", "ServiceCreated"), 1, "an Event says the Service was created")

	t.Run("someone else's label on the Service is left alone", func(t *testing.T) {
		update(t, service(ns, "web"), func(svc *corev1.Service) { svc.Labels["example.org/other"] = "theirs" })
	})

	t.Run("changes of the resource reach the Service and removed keys disappear", func(t *testing.T) {
		update(t, swh, func(swh *v1alpha1.ServiceWithHealthchecks) {
			swh.Labels = map[string]string{"team": "payments"}                // changed, tier removed
			swh.Annotations = map[string]string{"example.org/new": "1"}       // both old ones removed
			swh.Spec.Ports[0].TargetPort = intstr.FromString("web")           // named
			swh.Spec.Ports = append(swh.Spec.Ports[:1], v1alpha1.ServicePort{ // metrics removed, admin added
				Name: "admin", Protocol: corev1.ProtocolTCP, Port: 8443, TargetPort: intstr.FromInt32(8443),
			})
			swh.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		})

		svc := eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
			assert.Equal(c, map[string]string{"team": "payments", "example.org/other": "theirs"}, svc.Labels)
			assert.NotContains(c, svc.Annotations, "example.org/owner")
			assert.NotContains(c, svc.Annotations, "example.org/keep")
			assert.Equal(c, "1", svc.Annotations["example.org/new"])
			if assert.Len(c, svc.Spec.Ports, 2) {
				assert.Equal(c, "http", svc.Spec.Ports[0].Name)
				assert.Equal(c, intstr.FromString("web"), svc.Spec.Ports[0].TargetPort)
				assert.Equal(c, "admin", svc.Spec.Ports[1].Name)
			}
			assert.Equal(c, corev1.ServiceAffinityClientIP, svc.Spec.SessionAffinity)
		}, "the Service follows the resource")
		assert.Equal(t, clusterIP, svc.Spec.ClusterIP, "the cluster IP never changes")
		assert.Empty(t, svc.Spec.Selector)
	})

	t.Run("the type changes to NodePort and back", func(t *testing.T) {
		update(t, swh, func(swh *v1alpha1.ServiceWithHealthchecks) { swh.Spec.Type = corev1.ServiceTypeNodePort })
		eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
			assert.Equal(c, corev1.ServiceTypeNodePort, svc.Spec.Type)
			assert.NotZero(c, svc.Spec.Ports[0].NodePort)
			assert.Equal(c, corev1.ServiceExternalTrafficPolicyCluster, svc.Spec.ExternalTrafficPolicy)
		}, "the Service becomes a NodePort")

		update(t, swh, func(swh *v1alpha1.ServiceWithHealthchecks) { swh.Spec.Type = corev1.ServiceTypeClusterIP })
		eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
			assert.Equal(c, corev1.ServiceTypeClusterIP, svc.Spec.Type)
			assert.Zero(c, svc.Spec.Ports[0].NodePort)
			assert.Empty(c, svc.Spec.ExternalTrafficPolicy)
		}, "the Service is a ClusterIP again")
		eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
			assert.Equal(c, swh.Generation, swh.Status.ObservedGeneration)
			assert.Equal(c, metav1.ConditionTrue, condition(swh, v1alpha1.ConditionServiceSynced).Status)
		}, "the status follows the generation")
	})

	t.Run("a deleted Service is created again", func(t *testing.T) {
		old := service(ns, "web")
		require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(old), old))
		require.NoError(t, env.Client.Delete(t.Context(), old))
		eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
			assert.NotEqual(c, old.UID, svc.UID)
			assert.Equal(c, "payments", svc.Labels["team"])
		}, "the Service comes back")
	})

	t.Run("deleting the resource deletes its Service", func(t *testing.T) {
		require.NoError(t, env.Client.Delete(t.Context(), swh))
		gone(t, service(ns, "web"), "the Service of a deleted resource is deleted (envtest runs no garbage collector)")
	})
}

func TestAClusterIPAskedForAfterCreationIsReportedNotApplied(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "ip")
	startController(t, ns, nil)
	swh := newResource(ns, "web", nil)
	create(t, swh)
	svc := eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.NotEmpty(c, svc.Spec.ClusterIP)
	}, "the child Service is created")

	// The API server allocates from the upper part of the range first, so the address asked for
	// can be the one the Service already has (about one run in 240): then nothing is to report.
	asked := "10.0.0.254"
	if svc.Spec.ClusterIP == asked {
		asked = "10.0.0.253"
	}
	update(t, swh, func(swh *v1alpha1.ServiceWithHealthchecks) {
		swh.Labels = map[string]string{"changed": "too"}
		swh.Spec.ClusterIP = asked
	})

	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.Equal(c, swh.Generation, swh.Status.ObservedGeneration)
		cond := condition(swh, v1alpha1.ConditionServiceSynced)
		assert.Equal(c, childservice.ReasonClusterIPNotChanged, cond.Reason)
		assert.Equal(c, metav1.ConditionTrue, cond.Status)
		assert.Contains(c, cond.Message, asked)
		assert.Contains(c, cond.Message, svc.Spec.ClusterIP)
	}, "the status says the cluster IP is not changed")
	eventually(t, service(ns, "web"), func(c *assert.CollectT, s *corev1.Service) {
		assert.Equal(c, "too", s.Labels["changed"], "other changes still reach the Service")
		assert.Equal(c, svc.Spec.ClusterIP, s.Spec.ClusterIP)
	}, "the Service keeps its cluster IP")
}

func TestAForeignServiceIsNeverModified(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "foreign")
	run := startController(t, ns, nil)

	foreign := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns, Labels: map[string]string{"owner": "someone"}},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80}},
		},
	}
	create(t, foreign)
	rv := foreign.ResourceVersion

	swh := newResource(ns, "web", func(s *v1alpha1.ServiceWithHealthchecks) { s.Labels = map[string]string{"team": "web"} })
	create(t, swh)

	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		cond := condition(swh, v1alpha1.ConditionServiceSynced)
		assert.Equal(c, metav1.ConditionFalse, cond.Status)
		assert.Equal(c, childservice.ReasonForeignService, cond.Reason)
		assert.Contains(c, cond.Message, wellknown.AnnotationAdopt)
		assert.Empty(c, swh.Status.ClusterIP, "a foreign Service's address is not reported as ours")
	}, "the resource reports the foreign Service")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.NotEmpty(c, eventsAbout(t, ns, "web", childservice.ReasonForeignService))
	}, wait, tick, "an Event reports the foreign Service")
	assert.Positive(t, testutil.ToFloat64(run.metrics.Conflicts.WithLabelValues(metrics.ConflictForeignService)))

	// Reconcile again (a label change of the resource would be propagated to an owned Service).
	before := run.reconciles()
	update(t, swh, func(swh *v1alpha1.ServiceWithHealthchecks) { swh.Labels["team"] = "changed" })
	require.Eventually(t, func() bool { return run.reconciles() > before }, wait, tick, "the change is reconciled")

	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(foreign), foreign))
	assert.Equal(t, rv, foreign.ResourceVersion, "the foreign Service is untouched")
	assert.Equal(t, map[string]string{"app": "web"}, foreign.Spec.Selector)
	assert.Empty(t, foreign.OwnerReferences)
	assert.Zero(t, run.serviceWrites())

	t.Run("once the foreign Service is gone the resource creates its own", func(t *testing.T) {
		require.NoError(t, env.Client.Delete(t.Context(), foreign))
		eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
			assert.NotEqual(c, foreign.UID, svc.UID)
			assert.Empty(c, svc.Spec.Selector)
			assert.Equal(c, "changed", svc.Labels["team"])
		}, "the resource's own Service is created")
		eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
			assert.Equal(c, metav1.ConditionTrue, condition(swh, v1alpha1.ConditionServiceSynced).Status)
		}, "the resource is in sync")
	})
}

func TestStatusMirrorsTheLoadBalancer(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "lb")
	startController(t, ns, nil)
	swh := newResource(ns, "web", func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Type = corev1.ServiceTypeLoadBalancer })
	create(t, swh)
	svc := eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.Equal(c, corev1.ServiceTypeLoadBalancer, svc.Spec.Type)
	}, "the LoadBalancer Service is created")

	// What a load-balancer controller would write.
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(svc), svc); err != nil {
			return err
		}
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.10"}}
		return env.Client.Status().Update(t.Context(), svc)
	}))

	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		if assert.Len(c, swh.Status.LoadBalancer.Ingress, 1) {
			assert.Equal(c, "192.0.2.10", swh.Status.LoadBalancer.Ingress[0].IP)
		}
	}, "the resource's status mirrors the load balancer")
}

func TestAHeadlessResourceGetsAHeadlessService(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "headless")
	startController(t, ns, nil)
	swh := newResource(ns, "db", func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.ClusterIP = corev1.ClusterIPNone })
	create(t, swh)
	eventually(t, service(ns, "db"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.Equal(c, corev1.ClusterIPNone, svc.Spec.ClusterIP)
	}, "the Service is headless")

	// A later apply re-applies the cluster IP the controller owns, so nothing complains.
	update(t, swh, func(swh *v1alpha1.ServiceWithHealthchecks) { swh.Labels = map[string]string{"role": "primary"} })
	eventually(t, service(ns, "db"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.Equal(c, "primary", svc.Labels["role"])
		assert.Equal(c, corev1.ClusterIPNone, svc.Spec.ClusterIP)
	}, "the headless Service follows the resource")
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		cond := condition(swh, v1alpha1.ConditionServiceSynced)
		assert.Equal(c, childservice.ReasonSynced, cond.Reason)
		assert.Equal(c, swh.Generation, swh.Status.ObservedGeneration)
		assert.Equal(c, corev1.ClusterIPNone, swh.Status.ClusterIP)
	}, "the status is in sync")
}

func TestAServiceLeftByADeletedResourceOfTheSameNameIsReplaced(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "stale")
	startController(t, ns, nil)
	// What a resource deleted while no controller ran (and no garbage collector) leaves behind.
	stale := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web", Namespace: ns,
			OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference("web", "uid-of-a-deleted-web")},
		},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}
	create(t, stale)

	swh := newResource(ns, "web", nil)
	create(t, swh)
	svc := eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.NotEqual(c, stale.UID, svc.UID, "the stale Service was replaced")
	}, "the stale Service is replaced")
	require.Len(t, svc.OwnerReferences, 1)
	assert.Equal(t, swh.UID, svc.OwnerReferences[0].UID)
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.Equal(c, childservice.ReasonSynced, condition(swh, v1alpha1.ConditionServiceSynced).Reason)
	}, "the resource is in sync")
}

func TestAServiceTheAPIServerRejectsIsReported(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "invalid")
	startController(t, ns, nil)
	swh := newResource(ns, "web", func(s *v1alpha1.ServiceWithHealthchecks) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.LoadBalancerClass = ptr.To("example.org/one")
	})
	create(t, swh)
	svc := eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.Equal(c, ptr.To("example.org/one"), svc.Spec.LoadBalancerClass)
	}, "the LoadBalancer Service is created")

	// loadBalancerClass cannot change once set: the CRD cannot know, the Service's validation does.
	update(t, swh, func(swh *v1alpha1.ServiceWithHealthchecks) { swh.Spec.LoadBalancerClass = ptr.To("example.org/two") })
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		cond := condition(swh, v1alpha1.ConditionServiceSynced)
		assert.Equal(c, metav1.ConditionFalse, cond.Status)
		assert.Equal(c, childservice.ReasonInvalid, cond.Reason)
		assert.Contains(c, cond.Message, "loadBalancerClass")
		assert.Equal(c, svc.Spec.ClusterIP, swh.Status.ClusterIP, "the Service is still reported")
	}, "the status reports the rejection with the API server's message")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.NotEmpty(c, eventsAbout(t, ns, "web", childservice.ReasonInvalid))
	}, wait, tick, "a Warning Event reports the rejection")

	update(t, swh, func(swh *v1alpha1.ServiceWithHealthchecks) { swh.Spec.LoadBalancerClass = ptr.To("example.org/one") })
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.Equal(c, childservice.ReasonSynced, condition(swh, v1alpha1.ConditionServiceSynced).Reason)
	}, "reverting the change brings the resource back in sync")
}
