// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

const (
	childServicePolicy = bundle.ModuleName + "-child-service"
	statusPolicy       = bundle.ModuleName + "-status"
)

// applyTenantPolicies renders the chart with the childService settings (nil: the defaults) and
// writes its admission policies; a child-service policy the settings do not render (every check
// off) is deleted, as Helm would. ctx is separate from t so that a cleanup can restore the
// defaults after the test's context ended.
func applyTenantPolicies(ctx context.Context, t *testing.T, childService map[string]any) {
	t.Helper()
	set := bundle.ValueSet{}
	if childService != nil {
		set.Settings = map[string]any{"childService": childService}
	}
	objs := render(t, set)
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		for _, obj := range objs.OfKind(kind) {
			require.NoError(t, write(ctx, obj, false))
		}
	}
	if objs.Get("ValidatingAdmissionPolicy", "", childServicePolicy) != nil {
		return
	}
	for _, kind := range []string{"ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy"} {
		obj := objs.OfKind(kind)[0].DeepCopy()
		ri, err := resourceFor(obj)
		require.NoError(t, err)
		if err := ri.Delete(ctx, childServicePolicy, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			require.NoError(t, err)
		}
	}
}

// tenantClient impersonates user, an ordinary user (not system:masters) whom a Role in ns grants
// rules, and waits until the API server's authorizer knows the Role.
func tenantClient(t *testing.T, ns, user string, rules ...rbacv1.PolicyRule) client.Client {
	t.Helper()
	ctx := t.Context()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user}, Rules: rules}
	require.NoError(t, env.Client.Create(ctx, role))
	require.NoError(t, env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}))
	c, err := client.New(env.ConfigAs(user, "system:authenticated"), client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.NoError(ct, c.List(ctx, &v1alpha1.ServiceWithHealthchecksList{}, client.InNamespace(ns)))
	}, time.Minute, 100*time.Millisecond, "the Role of %s takes effect", user)
	return c
}

// resourceRules lets a user do everything with ServiceWithHealthchecks (not their status).
var resourceRules = rbacv1.PolicyRule{
	APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"servicewithhealthchecks"},
	Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"},
}

// serviceRules lets a user create and change Services themselves.
var serviceRules = rbacv1.PolicyRule{
	APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "create", "update", "patch"},
}

// tenantResource is a resource over app=web with one port; change adjusts it.
func tenantResource(ns, name string, change func(*v1alpha1.ServiceWithHealthchecks)) *v1alpha1.ServiceWithHealthchecks {
	swh := &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []v1alpha1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	if change != nil {
		change(swh)
	}
	return swh
}

func loadBalancer(ip, class string, annotations map[string]string) func(*v1alpha1.ServiceWithHealthchecks) {
	return func(s *v1alpha1.ServiceWithHealthchecks) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.LoadBalancerIP = ip
		if class != "" {
			s.Spec.LoadBalancerClass = ptr.To(class)
		}
		s.Annotations = annotations
	}
}

func externalIPs(ips ...string) func(*v1alpha1.ServiceWithHealthchecks) {
	return func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.ExternalIPs = ips }
}

func typ(t corev1.ServiceType) func(*v1alpha1.ServiceWithHealthchecks) {
	return func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Type = t }
}

func annotated(annotations map[string]string) func(*v1alpha1.ServiceWithHealthchecks) {
	return func(s *v1alpha1.ServiceWithHealthchecks) { s.Annotations = annotations }
}

// createDry creates the resource with server-side dry-run: through every admission step, stored
// nowhere, so the cases stay independent.
func createDry(swh *v1alpha1.ServiceWithHealthchecks) func(context.Context, client.Client) error {
	return func(ctx context.Context, c client.Client) error {
		return c.Create(ctx, swh.DeepCopy(), client.DryRunAll)
	}
}

// updateDry reads the stored resource ns/name as c, changes it and updates it with dry-run.
func updateDry(ns, name string, change func(*v1alpha1.ServiceWithHealthchecks)) func(context.Context, client.Client) error {
	return func(ctx context.Context, c client.Client) error {
		swh := &v1alpha1.ServiceWithHealthchecks{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, swh); err != nil {
			return err
		}
		change(swh)
		return c.Update(ctx, swh, client.DryRunAll)
	}
}

func addLabel(s *v1alpha1.ServiceWithHealthchecks) {
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	s.Labels["edited"] = "yes"
}

// Messages of the child-Service policy (templates/servicewithhealthchecks-admission-policy.yaml).
const (
	refusedExternalIPsForbidden = "external IPs are not allowed in this cluster (module setting childService.externalIPs: Forbidden)"
	refusedExternalIPsCreators  = "only a user who may create Services in the namespace (update the Service of that name, for a change) may set external IPs in this cluster (module setting childService.externalIPs: ServiceCreators)"
	refusedLoadBalancerIP       = "load-balancer addresses may not be asked for in this cluster (module setting childService.loadBalancerIP: Forbidden)"
	refusedType                 = "is not allowed in this cluster: the module setting childService.types allows ClusterIP, LoadBalancer"
	refusedClass                = "is not allowed in this cluster: the module setting childService.loadBalancerClasses allows example.com/internal"
	refusedNotAllowed           = "are not allowed in this cluster (the controller copies them to the Service): the module setting childService.annotations.allowed admits only example.com/*, team.example.com/owner"
	refusedForbidden            = "are not allowed in this cluster (the controller copies them to the Service): the module setting childService.annotations.forbidden refuses example.com/dangerous"
)

// Issue 16 part 4, no confused deputy. The controller writes child Services with its own
// account, so a tenant who may not create Services, or not these, would get them through a
// ServiceWithHealthchecks. The chart's child-service policy judges the resource as the user who
// writes it: with the defaults it refuses external IPs (CVE-2020-8554) and nothing else; with
// the settings narrowed it refuses the types, classes, load-balancer address and annotations
// they leave out, and lets a user the authorizer allows to write Services set external IPs.
// Resources admitted before a setting narrowed stay editable while the refused field is
// unchanged. Every write is made by impersonated ordinary users with namespaced Roles (alice:
// ServiceWithHealthchecks only; bob: Services too), after polling until the policy refuses.
func TestTheChildServicePolicyRefusesWhatTheTenantMayNotDoOnAService(t *testing.T) {
	ctx := t.Context()
	t.Cleanup(func() { applyTenantPolicies(context.WithoutCancel(ctx), t, nil) })
	ns := env.CreateNamespaceForTest(t, "tenant")
	alice := tenantClient(t, ns, "alice", resourceRules)
	bob := tenantClient(t, ns, "bob", resourceRules, serviceRules)

	// Before the rules: every check off. alice creates what the later settings refuse.
	applyTenantPolicies(ctx, t, map[string]any{"externalIPs": "Allowed"})
	withIPs := tenantResource(ns, "probe", externalIPs("192.0.2.1"))
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.NoError(ct, createDry(withIPs)(ctx, alice))
	}, time.Minute, 200*time.Millisecond, "with every check off, external IPs are admitted")
	legacy := map[string]*v1alpha1.ServiceWithHealthchecks{
		"legacy-eip": tenantResource(ns, "legacy-eip", externalIPs("192.0.2.10", "192.0.2.11")),
		"legacy-np":  tenantResource(ns, "legacy-np", typ(corev1.ServiceTypeNodePort)),
		"legacy-lb": tenantResource(ns, "legacy-lb", loadBalancer("192.0.2.20", "example.com/public",
			map[string]string{"metallb.universe.tf/address-pool": "public", "example.com/dangerous": "yes"})),
	}
	for _, swh := range legacy {
		require.NoError(t, alice.Create(ctx, swh.DeepCopy()))
	}

	t.Run("the defaults refuse external IPs only", func(t *testing.T) {
		applyTenantPolicies(ctx, t, nil)
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			policyRefusal(ct, createDry(withIPs)(ctx, alice), refusedExternalIPsForbidden)
		}, time.Minute, 200*time.Millisecond, "the default policy is in force")
		runWrites(t, alice, map[string]writeCase{
			"a new resource with external IPs is refused, naming them and the CVE": {
				do:      createDry(tenantResource(ns, "eip", externalIPs("192.0.2.1", "192.0.2.2"))),
				refusal: "spec.externalIPs 192.0.2.1, 192.0.2.2: " + refusedExternalIPsForbidden + "; every node would take the traffic for these addresses (CVE-2020-8554)",
			},
			"a LoadBalancer with an address, a class and MetalLB annotations is admitted as before": {
				do: createDry(tenantResource(ns, "lb", loadBalancer("192.0.2.30", "example.com/public",
					map[string]string{"metallb.universe.tf/address-pool": "public"}))),
			},
			"a NodePort resource is admitted": {do: createDry(tenantResource(ns, "np", typ(corev1.ServiceTypeNodePort)))},
			"a resource admitted with external IPs stays editable": {
				do: updateDry(ns, "legacy-eip", addLabel),
			},
			"removing one of its external IPs is admitted": {
				do: updateDry(ns, "legacy-eip", func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.ExternalIPs = []string{"192.0.2.11"} }),
			},
			"adding an external IP to it is refused, naming only the new one": {
				do: updateDry(ns, "legacy-eip", func(s *v1alpha1.ServiceWithHealthchecks) {
					s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, "192.0.2.12")
				}),
				refusal: "spec.externalIPs 192.0.2.12: " + refusedExternalIPsForbidden,
			},
		})
		runWrites(t, bob, map[string]writeCase{
			"a user who may create Services is refused external IPs too": {
				do: createDry(withIPs), refusal: refusedExternalIPsForbidden,
			},
		})
		runWrites(t, env.Client, map[string]writeCase{
			"the administrator is refused external IPs too (Forbidden means nobody)": {
				do: createDry(withIPs), refusal: refusedExternalIPsForbidden,
			},
		})
	})

	t.Run("narrowed settings refuse what they leave out", func(t *testing.T) {
		applyTenantPolicies(ctx, t, bundle.ValueSets()[bundle.SetTenantRules].Settings["childService"].(map[string]any))
		nodePort := tenantResource(ns, "np", typ(corev1.ServiceTypeNodePort))
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			policyRefusal(ct, createDry(nodePort)(ctx, alice), refusedType)
		}, time.Minute, 200*time.Millisecond, "the narrowed policy is in force")
		runWrites(t, alice, map[string]writeCase{
			"a NodePort resource is refused": {
				do: createDry(nodePort), refusal: "spec.type NodePort " + refusedType,
			},
			"a LoadBalancer of another class is refused": {
				do:      createDry(tenantResource(ns, "lb", loadBalancer("", "example.com/public", nil))),
				refusal: "spec.loadBalancerClass example.com/public " + refusedClass,
			},
			"a LoadBalancer of the allowed class with allowed annotations is admitted": {
				do: createDry(tenantResource(ns, "lb", loadBalancer("", "example.com/internal", map[string]string{
					"example.com/team": "shop", "team.example.com/owner": "alice",
					"kubectl.kubernetes.io/last-applied-configuration": "{}",
				}))),
			},
			"a load-balancer address is refused": {
				do:      createDry(tenantResource(ns, "lb", loadBalancer("192.0.2.30", "", nil))),
				refusal: "spec.loadBalancerIP 192.0.2.30: " + refusedLoadBalancerIP,
			},
			"an annotation outside the allowed patterns is refused, naming it": {
				do: createDry(tenantResource(ns, "lb", loadBalancer("", "", map[string]string{
					"metallb.universe.tf/address-pool": "public", "example.com/team": "shop",
				}))),
				refusal: "annotations metallb.universe.tf/address-pool " + refusedNotAllowed,
			},
			"a forbidden annotation is refused although an allowed pattern matches it": {
				do:      createDry(tenantResource(ns, "web", annotated(map[string]string{"example.com/dangerous": "yes"}))),
				refusal: "annotations example.com/dangerous " + refusedForbidden,
			},
			"external IPs are refused to a user who may not create Services": {
				do: createDry(withIPs), refusal: "spec.externalIPs 192.0.2.1: " + refusedExternalIPsCreators,
			},
			"a resource admitted as NodePort stays editable": {do: updateDry(ns, "legacy-np", addLabel)},
			"a resource admitted with a class, an address and refused annotations stays editable": {
				do: updateDry(ns, "legacy-lb", addLabel),
			},
			"changing the value of a refused annotation is refused": {
				do: updateDry(ns, "legacy-lb", func(s *v1alpha1.ServiceWithHealthchecks) {
					s.Annotations["metallb.universe.tf/address-pool"] = "other"
				}),
				refusal: "annotations metallb.universe.tf/address-pool " + refusedNotAllowed,
			},
			"changing the load-balancer address is refused": {
				do:      updateDry(ns, "legacy-lb", func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.LoadBalancerIP = "192.0.2.21" }),
				refusal: "spec.loadBalancerIP 192.0.2.21: " + refusedLoadBalancerIP,
			},
			"changing the type to one that is not allowed is refused": {
				do: updateDry(ns, "legacy-lb", func(s *v1alpha1.ServiceWithHealthchecks) {
					s.Spec.Type, s.Spec.LoadBalancerIP, s.Spec.LoadBalancerClass = corev1.ServiceTypeNodePort, "", nil
				}),
				refusal: "spec.type NodePort " + refusedType,
			},
			"adding an external IP is refused to alice": {
				do: updateDry(ns, "legacy-eip", func(s *v1alpha1.ServiceWithHealthchecks) {
					s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, "192.0.2.12")
				}),
				refusal: "spec.externalIPs 192.0.2.12: " + refusedExternalIPsCreators,
			},
		})
		runWrites(t, bob, map[string]writeCase{
			"a user who may create Services may set external IPs": {do: createDry(withIPs)},
			"a user who may update the Service may add an external IP": {
				do: updateDry(ns, "legacy-eip", func(s *v1alpha1.ServiceWithHealthchecks) {
					s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, "192.0.2.12")
				}),
			},
			"a user who may create Services is still refused a load-balancer address (Forbidden)": {
				do:      createDry(tenantResource(ns, "lb", loadBalancer("192.0.2.30", "", nil))),
				refusal: refusedLoadBalancerIP,
			},
			"a user who may create Services is still held to the types": {
				do: createDry(nodePort), refusal: refusedType,
			},
		})
	})
}

// Messages of the status policy.
const refusedStatus = "only the module controller (system:serviceaccount:" + bundle.Namespace + ":controller) may write the status of a ServiceWithHealthchecks, not "

// The agents publish a resource's pods only while its status.clusterIP says the child Service is
// its own (development/AGENT.md). A tenant whom RBAC lets write servicewithhealthchecks/status
// (carol, an impersonated ordinary user with a namespaced Role) is refused by the status policy,
// as an update and as a patch, and so is the administrator; the controller, with a token bound to
// a controller pod like the one its Deployment's pods get, writes the status.
func TestOnlyTheControllerWritesTheStatusOfAResource(t *testing.T) {
	ctx := t.Context()
	objs := render(t, bundle.ValueSets()[bundle.SetDefaults])
	apply(t, objs, append(append([]string{}, rbacKinds...), "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")...)
	ns := env.CreateNamespaceForTest(t, "status")
	swh := tenantResource(ns, "shop", nil)
	require.NoError(t, env.Client.Create(ctx, swh))
	carol := tenantClient(t, ns, "carol", resourceRules, rbacv1.PolicyRule{
		APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"servicewithhealthchecks/status"},
		Verbs: []string{"get", "update", "patch"},
	})
	claim := func(ctx context.Context, c client.Client) error {
		cur := &v1alpha1.ServiceWithHealthchecks{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(swh), cur); err != nil {
			return err
		}
		cur.Status.ClusterIP = "10.0.0.10"
		return c.Status().Update(ctx, cur)
	}
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		policyRefusal(ct, claim(ctx, carol), refusedStatus)
	}, time.Minute, 200*time.Millisecond, "the status policy is in force (and carol's Role lets her request reach it)")

	runWrites(t, carol, map[string]writeCase{
		"a tenant whom RBAC lets update the status is refused": {do: claim, refusal: refusedStatus + "carol"},
		"a tenant's status patch is refused": {
			do: func(ctx context.Context, c client.Client) error {
				patch := []byte(`{"status":{"clusterIP":"10.0.0.10"}}`)
				return c.Status().Patch(ctx, swh.DeepCopy(), client.RawPatch("application/merge-patch+json", patch))
			},
			refusal: refusedStatus + "carol",
		},
	})
	runWrites(t, env.Client, map[string]writeCase{
		"the administrator is refused": {do: claim, refusal: refusedStatus},
	})
	controller := podClient(t, "controller", "status-node")
	runWrites(t, controller, map[string]writeCase{
		"the controller's pod-bound token writes the status": {do: claim},
	})
	got := &v1alpha1.ServiceWithHealthchecks{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(swh), got))
	assert.Equal(t, "10.0.0.10", got.Status.ClusterIP, "the controller's status write was stored")
}
