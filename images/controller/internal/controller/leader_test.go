// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

func managers(svc *corev1.Service) []string {
	var out []string
	for _, f := range svc.ManagedFields {
		out = append(out, f.Manager)
	}
	return out
}

func TestOnlyTheLeaderWritesAndTheOtherTakesOver(t *testing.T) {
	tests := map[string]struct {
		keepLease bool
	}{
		"a leader that stops hands the Lease over":              {keepLease: false},
		"a leader that dies is replaced once its Lease expires": {keepLease: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			leaderHandOver(t, tc.keepLease)
		})
	}
}

func leaderHandOver(t *testing.T, keepLease bool) {
	ns := env.CreateNamespaceForTest(t, "leader")
	elect := func(fieldManager string) func(*Options) {
		return func(o *Options) {
			o.LeaderElect = true
			o.LeaderElectionNamespace = ns
			o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 2*time.Second, 1500*time.Millisecond, 200*time.Millisecond
			o.KeepLeaseOnStop = keepLease
			o.FieldManager = fieldManager
		}
	}
	a := startController(t, ns, elect("controller-a"))
	select {
	case <-a.mgr.Elected():
	case <-time.After(wait):
		t.Fatal("the first controller never became the leader")
	}
	b := startController(t, ns, elect("controller-b"))

	swh := newResource(ns, "web", func(s *v1alpha1.ServiceWithHealthchecks) { s.Labels = map[string]string{"step": "1"} })
	create(t, swh)
	eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.Equal(c, "1", svc.Labels["step"])
	}, "the leader creates the Service")

	setLabel := func(value string) {
		t.Helper()
		update(t, swh, func(swh *v1alpha1.ServiceWithHealthchecks) { swh.Labels["step"] = value })
	}
	setLabel("2")
	svc := eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.Equal(c, "2", svc.Labels["step"])
	}, "the leader updates the Service")
	assert.Equal(t, []string{"controller-a"}, managers(svc), "only the leader wrote the Service")
	assert.Positive(t, a.reconciles())
	assert.Zero(t, b.reconciles(), "the follower does not reconcile")
	select {
	case <-b.mgr.Elected():
		t.Fatal("the follower is elected while the leader runs")
	default:
	}

	a.stop()
	select {
	case <-b.mgr.Elected():
	case <-time.After(wait):
		t.Fatal("the follower never took over")
	}
	aReconciles := a.reconciles()

	setLabel("3")
	svc = eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.Equal(c, "3", svc.Labels["step"])
	}, "the new leader updates the Service")
	assert.Contains(t, managers(svc), "controller-b")
	setLabel("4")
	eventually(t, service(ns, "web"), func(c *assert.CollectT, svc *corev1.Service) {
		assert.Equal(c, "4", svc.Labels["step"])
	}, "the new leader keeps reconciling")
	eventually(t, swh, func(c *assert.CollectT, swh *v1alpha1.ServiceWithHealthchecks) {
		assert.Equal(c, swh.Generation, swh.Status.ObservedGeneration)
	}, "the new leader writes the status")
	assert.Positive(t, b.reconciles())
	assert.Equal(t, aReconciles, a.reconciles(), "the stopped leader reconciles no more")
}
