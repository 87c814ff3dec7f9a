// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

var rbacKinds = []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

// rbacFixture applies the chart's RBAC with one referenced credential Secret in a fresh
// namespace, and creates what the service accounts will touch.
type rbacFixture struct {
	ns           string
	referenced   string
	unreferenced string
	node         string
	swh          *v1alpha1.ServiceWithHealthchecks
}

func setupRBAC(t *testing.T) rbacFixture {
	t.Helper()
	ctx := t.Context()
	f := rbacFixture{
		ns:           env.CreateNamespaceForTest(t, "rbac"),
		referenced:   "pg-referenced",
		unreferenced: "pg-unreferenced",
		node:         "rbac-node-1",
	}
	objs := render(t, bundle.ValueSet{Internal: bundle.CredentialSecrets(
		bundle.NamespaceNames{Namespace: f.ns, Names: []string{f.referenced}},
	)})
	apply(t, objs, rbacKinds...)

	for _, name := range []string{f.referenced, f.unreferenced} {
		require.NoError(t, env.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
			Type:       wellknown.SecretTypePostgreSQLCredentials,
			Data:       map[string][]byte{"user": []byte("app"), "password": []byte("pw")},
		}))
	}
	// A Secret in the module namespace must stay out of reach too.
	moduleSecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: bundle.Namespace, Name: "module-secret-" + f.ns}}
	require.NoError(t, env.Client.Create(ctx, moduleSecret))

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.node}}
	if err := env.Client.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	f.swh = &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "db"},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Selector: map[string]string{"app": "db"},
			Ports:    []v1alpha1.ServicePort{{Name: "pg", Protocol: corev1.ProtocolTCP, Port: 5432, TargetPort: intstr.FromInt32(5432)}},
		},
	}
	require.NoError(t, env.Client.Create(ctx, f.swh))

	// The API server's authorizer learns new Roles and bindings from its informers: wait until
	// both accounts have their permissions before any check may see a Forbidden.
	agent, controller := saClient(t, "agent"), saClient(t, "controller")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.NoError(c, getSecret(f.ns, f.referenced)(ctx, agent))
		assert.NoError(c, controller.List(ctx, &v1alpha1.ServiceWithHealthchecksList{}))
	}, time.Minute, 100*time.Millisecond, "the chart's RBAC takes effect")
	return f
}

func saClient(t *testing.T, name string) client.Client {
	t.Helper()
	c, err := env.ServiceAccountClient(bundle.Namespace, name)
	require.NoError(t, err)
	return c
}

type check struct {
	do      func(ctx context.Context, c client.Client) error
	allowed bool
}

func runChecks(t *testing.T, c client.Client, checks map[string]check) {
	t.Helper()
	for name, ch := range checks {
		t.Run(name, func(t *testing.T) {
			err := ch.do(t.Context(), c)
			if ch.allowed {
				assert.NoError(t, err)
			} else {
				require.Error(t, err)
				assert.True(t, apierrors.IsForbidden(err), "want Forbidden, got %v", err)
			}
		})
	}
}

func getSecret(ns, name string) func(context.Context, client.Client) error {
	return func(ctx context.Context, c client.Client) error {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &corev1.Secret{})
	}
}

func reviews() map[string]check {
	return map[string]check{
		"kube-rbac-proxy may review tokens": {allowed: true, do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: "not-a-token"}})
		}},
		"kube-rbac-proxy may ask whether a caller is allowed": {allowed: true, do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: "someone", ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get", Resource: "pods"},
			}})
		}},
	}
}

func TestAgentCanDoItsJobAndReadsOnlyReferencedSecrets(t *testing.T) {
	f := setupRBAC(t)
	nodeObj := ensureNode(t, f.node)
	checks := map[string]check{
		"it lists the pods of its node": {allowed: true, do: func(ctx context.Context, c client.Client) error {
			return c.List(ctx, &corev1.PodList{}, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", f.node)})
		}},
		"it reads its node": {allowed: true, do: func(ctx context.Context, c client.Client) error {
			return c.Get(ctx, client.ObjectKey{Name: f.node}, &corev1.Node{})
		}},
		"it lists its node by name, as its cache watches it": {allowed: true, do: func(ctx context.Context, c client.Client) error {
			return c.List(ctx, &corev1.NodeList{}, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", f.node)})
		}},
		"it lists the resources": {allowed: true, do: func(ctx context.Context, c client.Client) error {
			return c.List(ctx, &v1alpha1.ServiceWithHealthchecksList{})
		}},
		// Slices and the Lease as the admission policies admit them (nodebound_test.go), so that
		// these checks hold whether or not another test has put the policies in force.
		"it publishes, updates and deletes slices": {allowed: true, do: func(ctx context.Context, c client.Client) error {
			s := ourSlice(f.ns, "db", f.node, f.node)
			if err := c.Create(ctx, s); err != nil {
				return err
			}
			s.Endpoints[0].Conditions.Ready = new(false)
			if err := c.Update(ctx, s); err != nil {
				return err
			}
			return c.Delete(ctx, s)
		}},
		"it keeps its Lease in the module namespace": {allowed: true, do: func(ctx context.Context, c client.Client) error {
			l := ownedByNode(agentLease(f.node), nodeObj)
			if err := c.Get(ctx, client.ObjectKeyFromObject(l), l); apierrors.IsNotFound(err) {
				if err := c.Create(ctx, l); err != nil {
					return err
				}
			} else if err != nil {
				return err
			}
			l.Spec.RenewTime = new(metav1.NewMicroTime(time.Now()))
			return c.Update(ctx, l)
		}},
		"it records events": {allowed: true, do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, &corev1.Event{
				ObjectMeta:     metav1.ObjectMeta{Namespace: f.ns, GenerateName: "db-"},
				InvolvedObject: corev1.ObjectReference{Kind: "ServiceWithHealthchecks", Namespace: f.ns, Name: "db"},
				Reason:         "ProbeFailed", Message: "probe failed", Type: corev1.EventTypeWarning,
			})
		}},
		"it reads a referenced credential Secret": {allowed: true, do: getSecret(f.ns, f.referenced)},
		"it watches a referenced credential Secret by name": {allowed: true, do: func(ctx context.Context, c client.Client) error {
			return c.List(ctx, &corev1.SecretList{}, client.InNamespace(f.ns),
				client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", f.referenced)})
		}},
		"it cannot read an unreferenced credential Secret": {do: getSecret(f.ns, f.unreferenced)},
		"it cannot list the Secrets of a namespace": {do: func(ctx context.Context, c client.Client) error {
			return c.List(ctx, &corev1.SecretList{}, client.InNamespace(f.ns))
		}},
		"it cannot read the module namespace's Secrets": {do: getSecret(bundle.Namespace, "module-secret-"+f.ns)},
		"it cannot keep Leases elsewhere": {do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "agent"}})
		}},
		"it cannot create Services": {do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "sneaky"},
				Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
			})
		}},
		"it cannot change the resources": {do: func(ctx context.Context, c client.Client) error {
			swh := f.swh.DeepCopy()
			swh.Labels = map[string]string{"changed": "yes"}
			return c.Update(ctx, swh)
		}},
	}
	for k, v := range reviews() {
		checks[k] = v
	}
	runChecks(t, podClient(t, "agent", f.node), checks)
}

func TestControllerCanDoItsJobAndReadsNoSecrets(t *testing.T) {
	f := setupRBAC(t)
	checks := map[string]check{
		"it writes the status of a resource": {allowed: true, do: func(ctx context.Context, c client.Client) error {
			swh := &v1alpha1.ServiceWithHealthchecks{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(f.swh), swh); err != nil {
				return err
			}
			swh.Status.ReadySummary = "pg: 0/0"
			return c.Status().Update(ctx, swh)
		}},
		"it creates, updates and deletes the child Service": {allowed: true, do: func(ctx context.Context, c client.Client) error {
			svc := &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "db", OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference("db", f.swh.UID)}},
				Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "pg", Port: 5432}}},
			}
			if err := c.Create(ctx, svc); err != nil {
				return err
			}
			svc.Labels = map[string]string{"touched": "yes"}
			if err := c.Update(ctx, svc); err != nil {
				return err
			}
			// A deleted resource's child Service is deleted by the controller (development/CONTROLLER.md).
			return c.Delete(ctx, svc)
		}},
		"it lists slices, nodes and pods": {allowed: true, do: func(ctx context.Context, c client.Client) error {
			for _, l := range []client.ObjectList{&discoveryv1.EndpointSliceList{}, &corev1.NodeList{}, &corev1.PodList{}} {
				if err := c.List(ctx, l); err != nil {
					return err
				}
			}
			return nil
		}},
		"it removes a slice": {allowed: true, do: func(ctx context.Context, c client.Client) error {
			s := ourSlice(f.ns, "orphan", f.node, f.node)
			if err := env.Client.Create(ctx, s); err != nil {
				return err
			}
			return c.Delete(ctx, s)
		}},
		"it elects a leader and reads the agents' Leases": {allowed: true, do: func(ctx context.Context, c client.Client) error {
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: bundle.Namespace, Name: bundle.ControllerElectionLease}}
			if err := c.Get(ctx, client.ObjectKeyFromObject(l), l); apierrors.IsNotFound(err) {
				if err := c.Create(ctx, l); err != nil {
					return err
				}
			} else if err != nil {
				return err
			}
			l.Spec.HolderIdentity = new("controller-0")
			if err := c.Update(ctx, l); err != nil {
				return err
			}
			return c.List(ctx, &coordinationv1.LeaseList{}, client.InNamespace(bundle.Namespace))
		}},
		"it records events": {allowed: true, do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, &corev1.Event{
				ObjectMeta:     metav1.ObjectMeta{Namespace: f.ns, GenerateName: "db-"},
				InvolvedObject: corev1.ObjectReference{Kind: "ServiceWithHealthchecks", Namespace: f.ns, Name: "db"},
				Reason:         "Adopted", Message: "adopted", Type: corev1.EventTypeNormal,
			})
		}},
		"it cannot read a referenced credential Secret": {do: getSecret(f.ns, f.referenced)},
		"it cannot list Secrets":                        {do: func(ctx context.Context, c client.Client) error { return c.List(ctx, &corev1.SecretList{}) }},
		"it cannot publish slices": {do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Namespace: f.ns, Name: "not-mine"},
				AddressType: discoveryv1.AddressTypeIPv4,
			})
		}},
		"it cannot change a resource's spec": {do: func(ctx context.Context, c client.Client) error {
			swh := f.swh.DeepCopy()
			swh.Labels = map[string]string{"changed": "yes"}
			return c.Update(ctx, swh)
		}},
		"it cannot keep Leases elsewhere": {do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "controller"}})
		}},
	}
	for k, v := range reviews() {
		checks[k] = v
	}
	runChecks(t, podClient(t, "controller", f.node), checks)
}
