// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/childservice"
	"github.com/deckhouse/service-with-healthchecks/testkit/faults"
)

// refusal is the message of the admission policy that refuses clearing a Service's selector.
const refusal = "the test refuses every change of this Service's selector"

// TestWriteFailsKeepStatusClusterIP: the API server refuses, through an
// admission policy, the controller's patch that clears the selector of a Service it adopted (an
// ordinary error, not a conflict). The Service is still this resource's: status.clusterIP keeps
// its address (the agents would read an empty one as "not ours" and withdraw every endpoint),
// ServiceSynced says why the write failed, and once the fault ends the selector is cleared and
// everything is synced. Fails on a controller that reports no Service when a write fails.
func TestWriteFailsKeepStatusClusterIP(t *testing.T) {
	ns := env.CreateNamespaceForTest(t, "writefails")
	startController(t, ns, nil)
	node(t, ns+"-n1")

	// An adopted Service whose selector still selects a pod: the selector waits for a ready
	// endpoint of this module on every port.
	create(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: ns, Labels: map[string]string{"app": "web"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "web"}}},
	})
	live := liveService(ns)
	create(t, live)
	swh := newResource(ns, "web", func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Type = corev1.ServiceTypeNodePort })
	create(t, swh)
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.Equal(c, childservice.ReasonSelectorPending, condition(swh, v1alpha1.ConditionServiceSynced).Reason)
		assert.Equal(c, live.Spec.ClusterIP, swh.Status.ClusterIP, "the adopted Service is the resource's")
	}, "the Service is adopted and keeps its selector")

	// The fault: clearing the selector is refused. Then every port gets a ready endpoint, so
	// the controller clears the selector, and fails.
	end := faults.RefuseSelectorChanges(t, env.Client, ns, "web", refusal, wait, tick)
	slice(t, ns, "web", swh.UID, "http", ns+"-n1")
	slice(t, ns, "web", swh.UID, "metrics", ns+"-n1")
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		cond := condition(swh, v1alpha1.ConditionServiceSynced)
		assert.Equal(c, metav1.ConditionFalse, cond.Status)
		// An admission refusal is a 422 (Invalid); a 500 or a timeout would be WriteFailed.
		assert.Contains(c, []string{childservice.ReasonInvalid, childservice.ReasonWriteFailed}, cond.Reason)
		assert.Contains(c, cond.Message, refusal, "the condition says why")
	}, "ServiceSynced carries the write error")
	assert.Equal(t, live.Spec.ClusterIP, swh.Status.ClusterIP, "a failed write keeps status.clusterIP: the Service is still ours")
	svc := eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {}, "the Service exists")
	assert.Equal(t, map[string]string{"app": "web"}, svc.Spec.Selector, "the refused write did not happen")

	// The fault ends: the selector is cleared and the resource is synced, its cluster IP kept.
	end()
	eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.Empty(c, svc.Spec.Selector)
	}, "the selector is cleared once the API server accepts it")
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		cond := condition(swh, v1alpha1.ConditionServiceSynced)
		assert.Equal(c, metav1.ConditionTrue, cond.Status)
		assert.Equal(c, childservice.ReasonSynced, cond.Reason)
		assert.Equal(c, live.Spec.ClusterIP, swh.Status.ClusterIP)
	}, "everything recovers when the fault ends")
}
