// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package status

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

func TestCompute(t *testing.T) {
	earlier := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	now := metav1.NewTime(earlier.Add(time.Hour))
	synced := metav1.Condition{Type: v1alpha1.ConditionServiceSynced, Status: metav1.ConditionTrue, Reason: "Synced", Message: "ok"}
	svc := &corev1.Service{
		Spec:   corev1.ServiceSpec{ClusterIP: "10.0.0.10"},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "192.0.2.1"}}}},
	}
	other := metav1.Condition{Type: "ComputedElsewhere", Status: metav1.ConditionFalse, Reason: "Elsewhere", LastTransitionTime: earlier}
	withStatus := func(st v1alpha1.ServiceWithHealthchecksStatus) *v1alpha1.ServiceWithHealthchecks {
		return &v1alpha1.ServiceWithHealthchecks{ObjectMeta: metav1.ObjectMeta{Generation: 3}, Status: st}
	}
	tests := map[string]struct {
		in   Observed
		want v1alpha1.ServiceWithHealthchecksStatus
	}{
		"a fresh resource gets the condition, the generation, the cluster IP and the load balancer": {
			in: Observed{Resource: withStatus(v1alpha1.ServiceWithHealthchecksStatus{}), Service: svc, ServiceSynced: synced, Now: now},
			want: v1alpha1.ServiceWithHealthchecksStatus{
				ObservedGeneration: 3,
				Conditions:         []metav1.Condition{{Type: "ServiceSynced", Status: "True", Reason: "Synced", Message: "ok", ObservedGeneration: 3, LastTransitionTime: now}},
				ClusterIP:          "10.0.0.10",
				LoadBalancer:       svc.Status.LoadBalancer,
			},
		},
		"an unchanged condition keeps its transition time, and conditions computed elsewhere stay": {
			in: Observed{Resource: withStatus(v1alpha1.ServiceWithHealthchecksStatus{
				Conditions: []metav1.Condition{other, {Type: "ServiceSynced", Status: "True", Reason: "Synced", Message: "ok", ObservedGeneration: 2, LastTransitionTime: earlier}},
			}), Service: svc, ServiceSynced: synced, Now: now},
			want: v1alpha1.ServiceWithHealthchecksStatus{
				ObservedGeneration: 3,
				Conditions:         []metav1.Condition{other, {Type: "ServiceSynced", Status: "True", Reason: "Synced", Message: "ok", ObservedGeneration: 3, LastTransitionTime: earlier}},
				ClusterIP:          "10.0.0.10",
				LoadBalancer:       svc.Status.LoadBalancer,
			},
		},
		"without a Service of this resource nothing of a Service is reported": {
			in: Observed{Resource: withStatus(v1alpha1.ServiceWithHealthchecksStatus{ClusterIP: "10.0.0.10", LoadBalancer: svc.Status.LoadBalancer}),
				ServiceSynced: metav1.Condition{Status: metav1.ConditionFalse, Reason: "ForeignService", Message: "not ours"}, Now: now},
			want: v1alpha1.ServiceWithHealthchecksStatus{
				ObservedGeneration: 3,
				Conditions:         []metav1.Condition{{Type: "ServiceSynced", Status: "False", Reason: "ForeignService", Message: "not ours", ObservedGeneration: 3, LastTransitionTime: now}},
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := Compute(tc.in)
			// Only what this table is about: the endpoint, conflict and bounds conditions have their own.
			for _, typ := range []string{v1alpha1.ConditionEndpointsAvailable, v1alpha1.ConditionReady, v1alpha1.ConditionSliceNameConflict, v1alpha1.ConditionSpecOutOfBounds} {
				assert.NotNil(t, meta.FindStatusCondition(got.Conditions, typ), typ)
			}
			trimmed := *got.DeepCopy()
			for _, typ := range []string{v1alpha1.ConditionEndpointsAvailable, v1alpha1.ConditionReady, v1alpha1.ConditionSliceNameConflict, v1alpha1.ConditionSpecOutOfBounds} {
				meta.RemoveStatusCondition(&trimmed.Conditions, typ)
			}
			assert.Equal(t, tc.want, trimmed)
			again := Compute(Observed{Resource: withStatus(got), Service: tc.in.Service, ServiceSynced: tc.in.ServiceSynced, Now: metav1.NewTime(now.Add(time.Hour))})
			assert.False(t, Changed(&got, &again), "computing again from the result changes nothing")
		})
	}
}
