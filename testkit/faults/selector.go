// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package faults makes a real API server fail the writes a test names, the way a production
// cluster's admission (a policy, a webhook) refuses them: an ordinary error the programs must
// survive, not a conflict they retry.
package faults

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// RefuseSelectorChanges makes the API server refuse, with a ValidatingAdmissionPolicy whose
// message is refusal, every update of Service ns/name that changes its selector (the controller's
// patch that clears an adopted Service's selector), and waits, polling every poll up to waitFor,
// until the policy is in effect (a dry-run clear is refused). The returned function ends the
// fault; it also runs when the test ends.
func RefuseSelectorChanges(t *testing.T, c client.Client, ns, name, refusal string, waitFor, poll time.Duration) func() {
	t.Helper()
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "refuse-selector-" + ns},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"services"}},
				},
			}}},
			MatchConditions: []admissionregistrationv1.MatchCondition{{
				Name: "this-service", Expression: fmt.Sprintf("request.namespace == %q && request.name == %q", ns, name),
			}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "(has(object.spec.selector) ? object.spec.selector : {}) == (has(oldObject.spec.selector) ? oldObject.spec.selector : {})",
				Message:    refusal,
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	require.NoError(t, c.Create(t.Context(), policy))
	require.NoError(t, c.Create(t.Context(), binding))
	end := func() {
		_ = client.IgnoreNotFound(c.Delete(t.Context(), binding))
		_ = client.IgnoreNotFound(c.Delete(t.Context(), policy))
	}
	t.Cleanup(end)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		patch := client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"selector":null}}`))
		err := c.Patch(t.Context(), svc, patch, client.DryRunAll)
		if assert.Error(ct, err, "the policy refuses a dry-run clear") {
			assert.Contains(ct, err.Error(), refusal)
		}
	}, waitFor, poll, "the admission policy takes effect")
	return end
}
