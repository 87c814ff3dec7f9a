// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// TestEveryPolicyIsBoundToDenyAndTheNodeBoundOnesMatchTheProgramsAccounts: each admission
// policy has a Deny binding, and the node-bound policies (templates/agent/admission-policy.yaml,
// templates/controller/admission-policy.yaml) match the service account the DaemonSet or the
// Deployment runs as, so a renamed account cannot silently leave a program unchecked. What the
// policies admit and refuse is tested on a real API server (tests/cluster/nodebound_test.go).
func TestEveryPolicyIsBoundToDenyAndTheNodeBoundOnesMatchTheProgramsAccounts(t *testing.T) {
	objs := render(t, bundle.ValueSets()[bundle.SetDefaults])
	ds, err := objs.DaemonSet(bundle.Namespace, "agent")
	require.NoError(t, err)
	deploy, err := objs.Deployment(bundle.Namespace, "controller")
	require.NoError(t, err)
	users := map[string]string{
		"agent":      "system:serviceaccount:" + bundle.Namespace + ":" + ds.Spec.Template.Spec.ServiceAccountName,
		"controller": "system:serviceaccount:" + bundle.Namespace + ":" + deploy.Spec.Template.Spec.ServiceAccountName,
	}

	bindings := map[string]admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	for _, obj := range objs.OfKind("ValidatingAdmissionPolicyBinding") {
		var b admissionregistrationv1.ValidatingAdmissionPolicyBinding
		require.NoError(t, bundle.Convert(obj, &b))
		bindings[b.Spec.PolicyName] = b
	}
	nodeBound := map[string]string{
		bundle.ModuleName + "-agent-endpointslices":      "agent",
		bundle.ModuleName + "-agent-lease":               "agent",
		bundle.ModuleName + "-controller-services":       "controller",
		bundle.ModuleName + "-controller-endpointslices": "controller",
		bundle.ModuleName + "-controller-lease":          "controller",
	}
	seen := 0
	for _, obj := range objs.OfKind("ValidatingAdmissionPolicy") {
		var p admissionregistrationv1.ValidatingAdmissionPolicy
		require.NoError(t, bundle.Convert(obj, &p))
		t.Run(p.Name, func(t *testing.T) {
			b, ok := bindings[p.Name]
			require.True(t, ok, "the policy has a binding")
			assert.Equal(t, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}, b.Spec.ValidationActions)
			require.NotNil(t, p.Spec.FailurePolicy)
			assert.Equal(t, admissionregistrationv1.Fail, *p.Spec.FailurePolicy, "a policy that cannot decide refuses")
			program, ok := nodeBound[p.Name]
			if !ok {
				return
			}
			seen++
			require.Len(t, p.Spec.MatchConditions, 1)
			assert.Equal(t, `request.userInfo.username == "`+users[program]+`"`, p.Spec.MatchConditions[0].Expression,
				"the policy holds the %s's account", program)
			for _, v := range p.Spec.Validations {
				assert.Equal(t, "Forbidden", string(*v.Reason), "a refusal is a 403")
				assert.True(t, v.Message != "" || v.MessageExpression != "", "every refusal says why")
			}
		})
	}
	assert.Equal(t, len(nodeBound), seen, "every node-bound policy is rendered")
}
