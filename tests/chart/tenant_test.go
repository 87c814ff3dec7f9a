// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/platform"
)

const (
	childServicePolicy = bundle.ModuleName + "-child-service"
	statusPolicy       = bundle.ModuleName + "-status"
)

// policy is the rendered ValidatingAdmissionPolicy name, typed, or nil when it is not rendered.
func policy(t *testing.T, objs bundle.Objects, name string) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	obj := objs.Get("ValidatingAdmissionPolicy", "", name)
	if obj == nil {
		return nil
	}
	var p admissionregistrationv1.ValidatingAdmissionPolicy
	require.NoError(t, bundle.Convert(obj, &p))
	return &p
}

// checks names the checks of the child-Service policy by the field its message starts with.
func checks(p *admissionregistrationv1.ValidatingAdmissionPolicy) []string {
	var out []string
	for _, v := range p.Spec.Validations {
		field, _, _ := strings.Cut(strings.TrimPrefix(v.MessageExpression, "'"), " ")
		if field == "annotations" {
			switch {
			case strings.Contains(v.MessageExpression, "annotations.allowed"):
				field = "annotations.allowed"
			case strings.Contains(v.MessageExpression, "annotations.forbidden"):
				field = "annotations.forbidden"
			}
		}
		out = append(out, field)
	}
	return out
}

// TestTheChildServicePolicyRendersTheChecksTheSettingsTurnOn: only the narrowing settings render a
// check (the others are not evaluated at all), the authorizer is asked only in the
// ServiceCreators modes, and with every check off there is no policy (a policy needs a
// validation). What each check admits and refuses is tested on a real API server
// (tests/cluster/tenant_test.go).
func TestTheChildServicePolicyRendersTheChecksTheSettingsTurnOn(t *testing.T) {
	cases := map[string]struct {
		childService   map[string]any
		wantChecks     []string
		wantAuthorizer bool
	}{
		"the defaults refuse only external IPs": {
			wantChecks: []string{"spec.externalIPs"},
		},
		"every check off renders no policy": {
			childService: map[string]any{"externalIPs": "Allowed"},
		},
		"service creators may set external IPs, asked of the authorizer": {
			childService:   map[string]any{"externalIPs": "ServiceCreators"},
			wantChecks:     []string{"spec.externalIPs"},
			wantAuthorizer: true,
		},
		"listing every type narrows nothing": {
			childService: map[string]any{"externalIPs": "Allowed", "types": []any{"LoadBalancer", "ClusterIP", "NodePort"}},
		},
		"an empty class list is a check (no class may be named)": {
			childService: map[string]any{"externalIPs": "Allowed", "loadBalancerClasses": []any{}},
			wantChecks:   []string{"spec.loadBalancerClass"},
		},
		"an empty list of allowed annotations is a check (none may be set)": {
			childService: map[string]any{"externalIPs": "Allowed", "annotations": map[string]any{"allowed": []any{}}},
			wantChecks:   []string{"annotations.allowed"},
		},
		"every narrowing setting renders its check": {
			childService:   bundle.ValueSets()[bundle.SetTenantRules].Settings["childService"].(map[string]any),
			wantChecks:     []string{"spec.externalIPs", "spec.loadBalancerIP", "spec.type", "spec.loadBalancerClass", "annotations.allowed", "annotations.forbidden"},
			wantAuthorizer: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			set := bundle.ValueSet{}
			if tc.childService != nil {
				set.Settings = map[string]any{"childService": tc.childService}
			}
			objs := render(t, set)
			p := policy(t, objs, childServicePolicy)
			binding := objs.Get("ValidatingAdmissionPolicyBinding", "", childServicePolicy)
			if tc.wantChecks == nil {
				assert.Nil(t, p, "no policy")
				assert.Nil(t, binding, "no binding")
				return
			}
			require.NotNil(t, p)
			require.NotNil(t, binding)
			assert.Equal(t, tc.wantChecks, checks(p))
			usesAuthorizer := false
			for _, v := range p.Spec.Validations {
				assert.Equal(t, "Forbidden", string(*v.Reason), "a refusal is a 403")
				usesAuthorizer = usesAuthorizer || strings.Contains(v.Expression, "variables.mayWriteServices")
			}
			assert.Equal(t, tc.wantAuthorizer, usesAuthorizer, "the authorizer is asked only in the ServiceCreators modes")
			require.NotNil(t, p.Spec.MatchConstraints)
			require.Len(t, p.Spec.MatchConstraints.ResourceRules, 1)
			rule := p.Spec.MatchConstraints.ResourceRules[0]
			assert.Equal(t, []string{"servicewithhealthchecks"}, rule.Resources, "the resource itself, not its status")
			assert.ElementsMatch(t, []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}, rule.Operations)
			assert.Empty(t, p.Spec.MatchConditions, "every user is judged, the administrator too")
		})
	}
}

// TestOnlyTheControllersAccountMayWriteTheStatus: the status policy matches every write of the
// status subresource and admits exactly the account the Deployment runs as.
func TestOnlyTheControllersAccountMayWriteTheStatus(t *testing.T) {
	objs := render(t, bundle.ValueSets()[bundle.SetDefaults])
	deploy, err := objs.Deployment(bundle.Namespace, "controller")
	require.NoError(t, err)
	p := policy(t, objs, statusPolicy)
	require.NotNil(t, p)
	require.NotNil(t, p.Spec.MatchConstraints)
	require.Len(t, p.Spec.MatchConstraints.ResourceRules, 1)
	rule := p.Spec.MatchConstraints.ResourceRules[0]
	assert.Equal(t, []string{"servicewithhealthchecks/status"}, rule.Resources)
	assert.Equal(t, []string{"network.deckhouse.io"}, rule.APIGroups)
	assert.Equal(t, []admissionregistrationv1.OperationType{admissionregistrationv1.Update}, rule.Operations, "patches are updates to admission")
	assert.Empty(t, p.Spec.MatchConditions, "every caller is judged")
	require.Len(t, p.Spec.Validations, 1)
	controller := "system:serviceaccount:" + bundle.Namespace + ":" + deploy.Spec.Template.Spec.ServiceAccountName
	assert.Equal(t, `request.userInfo.username == "`+controller+`"`, p.Spec.Validations[0].Expression)
	assert.Equal(t, "Forbidden", string(*p.Spec.Validations[0].Reason))
}

// TestTheAgentsRenewTheirLeaseWithinTheGrace (issue 16 part 6) goes from a ModuleConfig through
// the settings schema and the real settings hook to the rendered programs: the controller gets
// the grace, the agents a quarter of it, at most 10 s; a grace below 4 s is refused before
// anything renders.
func TestTheAgentsRenewTheirLeaseWithinTheGrace(t *testing.T) {
	enabling, _ := configurationExamples(t)
	cases := map[string]struct {
		grace     string // "" leaves the setting out
		wantRenew string
		wantErr   string
	}{
		"the default grace keeps the agents' 10 s":               {wantRenew: "10s"},
		"a grace of 6 s renews every 1.5 s (it flapped at 10 s)": {grace: "6s", wantRenew: "1.5s"},
		"the shortest grace renews every second":                 {grace: "4s", wantRenew: "1s"},
		"a long grace stays at 10 s":                             {grace: "2m", wantRenew: "10s"},
		"a grace below 4 s is refused":                           {grace: "3s", wantErr: "agentLostGrace"},
		"half a second is refused":                               {grace: "500ms", wantErr: "agentLostGrace"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			mc := enabling
			if tc.grace != "" {
				mc.Spec.Version = 1
				mc.Spec.Settings = map[string]any{"agentLostGrace": tc.grace}
			}
			values, context, err := platform.Values(t, mc, bundle.ValueSet{}, platform.Cluster{})
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			rendered, err := bundle.RenderContext(values, context)
			require.NoError(t, err)
			objs := bundle.Objects(rendered)
			agent, err := objs.DaemonSet(bundle.Namespace, "agent")
			require.NoError(t, err)
			got, ok := bundle.Flag(bundle.Container(&agent.Spec.Template.Spec, "agent"), "lease-renew-interval")
			require.True(t, ok, "--lease-renew-interval is rendered")
			assert.Equal(t, tc.wantRenew, got)
			ctrl, err := objs.Deployment(bundle.Namespace, "controller")
			require.NoError(t, err)
			grace, ok := bundle.Flag(bundle.Container(&ctrl.Spec.Template.Spec, "controller"), "agent-lost-grace")
			require.True(t, ok)
			assert.Equal(t, map[bool]string{true: "40s", false: tc.grace}[tc.grace == ""], grace)
		})
	}
}
