// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package liveness

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/deckhouse/service-with-healthchecks/api/probebudget"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

func budgetLease(node, note string) coordinationv1.Lease {
	renew := metav1.NewMicroTime(time.Unix(100, 0))
	l := coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: wellknown.AgentLeaseName(node),
		Annotations: map[string]string{wellknown.AnnotationNode: node}}}
	l.Spec.RenewTime = &renew
	if note != "" {
		l.Annotations[probebudget.Annotation] = note
	}
	return l
}

func TestBudgetNotesFromLeases(t *testing.T) {
	hog := types.NamespacedName{Namespace: "hog", Name: "hog"}
	note := func(allowed int) string {
		return probebudget.Encode(probebudget.Note{Budget: 10, Over: []probebudget.Resource{{Namespace: "hog", Name: "hog", Asked: 30, Allowed: allowed}}})
	}
	leases := []coordinationv1.Lease{
		budgetLease("node-b", note(4)),
		budgetLease("node-a", note(5)),
		budgetLease("node-c", ""),
		budgetLease("gone", note(1)),
		budgetLease("node-d", "{garbage"),
	}
	got := BudgetNotes(leases, sets.New("node-a", "node-b", "node-c", "node-d"))
	assert.Equal(t, map[types.NamespacedName][]NodeBudget{hog: {
		{Node: "node-a", Budget: 10, Asked: 30, Allowed: 5},
		{Node: "node-b", Budget: 10, Asked: 30, Allowed: 4},
	}}, got, "by node; a Node that does not exist and an unreadable note are skipped")

	var b budgetBoard
	assert.Equal(t, []types.NamespacedName{hog}, b.publish(got), "new reports change the resource")
	assert.Empty(t, b.publish(BudgetNotes(leases, sets.New("node-a", "node-b"))), "the same reports change nothing")
	assert.Equal(t, []types.NamespacedName{hog}, b.publish(nil), "reports that go change it again")
	assert.Empty(t, b.of(hog))
}
