// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// nodeNameKey is where the API server puts the node claim of a pod-bound service-account token.
const nodeNameKey = "authentication.kubernetes.io/node-name"

// ensureNode creates the Node name unless it exists.
func ensureNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	err := env.Client.Create(t.Context(), n)
	if apierrors.IsAlreadyExists(err) {
		require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(n), n))
		return n
	}
	require.NoError(t, err)
	return n
}

// podClient is a client that authenticates exactly as a pod of the chart does: as the service
// account sa of the module namespace, with a token from TokenRequest bound to a Pod of that
// account scheduled to node (spec.nodeName), like the token the kubelet projects into the
// DaemonSet's and the Deployment's pods. The API server turns the token's node claim into
// userInfo.extra["authentication.kubernetes.io/node-name"]; the client checks that it did
// (SelfSubjectReview), so a harness without node claims fails here rather than in the policy
// tests. The Pod is deleted when the test ends.
func podClient(t *testing.T, sa, node string) client.Client {
	t.Helper()
	ctx := t.Context()
	ensureNode(t, node)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: bundle.Namespace, GenerateName: sa + "-"},
		Spec: corev1.PodSpec{
			ServiceAccountName:           sa,
			NodeName:                     node,
			AutomountServiceAccountToken: ptr.To(false),
			Containers:                   []corev1.Container{{Name: sa, Image: bundle.GlobalRegistryBase + "@" + bundle.AgentDigest}},
		},
	}
	require.NoError(t, env.Client.Create(ctx, pod))
	t.Cleanup(func() { _ = env.Client.Delete(context.WithoutCancel(ctx), pod) })

	cs, err := kubernetes.NewForConfig(env.Config)
	require.NoError(t, err)
	tr, err := cs.CoreV1().ServiceAccounts(bundle.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID},
			ExpirationSeconds: ptr.To[int64](3600),
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err, "TokenRequest for %s bound to pod %s", sa, pod.Name)

	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = tr.Status.Token
	cfg.QPS, cfg.Burst = 1000, 2000
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)

	review := &authenticationv1.SelfSubjectReview{}
	require.NoError(t, c.Create(ctx, review), "the pod-bound token authenticates")
	user := review.Status.UserInfo
	assert.Equal(t, "system:serviceaccount:"+bundle.Namespace+":"+sa, user.Username)
	require.Equal(t, authenticationv1.ExtraValue{node}, user.Extra[nodeNameKey],
		"the API server puts the token's node claim into the user's extra (extra: %v)", user.Extra)
	return c
}

// impersonatedClient acts as the service account sa of the module namespace with its groups but
// without any extra: what a token not bound to a pod on a node (a legacy Secret token, or a
// cluster whose API server does not issue node claims) looks like to admission.
func impersonatedClient(t *testing.T, sa string) client.Client {
	t.Helper()
	return saClient(t, sa)
}

// policyRefusal asserts that err is a refusal by one of the module's admission policies whose
// message contains want.
func policyRefusal(t assert.TestingT, err error, want string) bool {
	if h, ok := t.(interface{ Helper() }); ok {
		h.Helper()
	}
	if !assert.Error(t, err, "want a refusal containing %q", want) {
		return false
	}
	ok := assert.True(t, apierrors.IsForbidden(err), "want Forbidden, got %v", err)
	ok = assert.True(t, strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+bundle.ModuleName+"-"), "want a refusal by the module's policy, got %v", err) && ok
	return assert.Contains(t, err.Error(), want) && ok
}

// enforcePolicies applies the chart's admission policies (and its RBAC, so that the accounts'
// requests reach admission) and waits until every policy of the agent and the controller refuses
// what it must: a policy takes a few seconds to be in force.
func enforcePolicies(t *testing.T) {
	t.Helper()
	objs := render(t, bundle.ValueSets()[bundle.SetDefaults])
	apply(t, objs, append(append([]string{}, rbacKinds...), "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")...)
	ns := "default"
	// The controller may not create slices at all (RBAC): its slice policy is probed with the
	// delete of a slice another controller manages.
	foreign := ourSlice(ns, "probe", "probe-node", "probe-node")
	foreign.Name = "probe-foreign"
	foreign.Labels[discoveryv1.LabelManagedBy] = "someone-else"
	if err := env.Client.Create(t.Context(), foreign); !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	agent, controller := impersonatedClient(t, "agent"), impersonatedClient(t, "controller")
	probes := map[string]func() error{
		"agent slices names no node": func() error {
			return agent.Create(t.Context(), ourSlice(ns, "probe", "probe-node", "probe-node"), client.DryRunAll)
		},
		"agent lease names no node": func() error {
			return agent.Create(t.Context(), agentLease("probe-node"), client.DryRunAll)
		},
		"may create only a Service controlled": func() error {
			return controller.Create(t.Context(), &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe"},
				Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
			}, client.DryRunAll)
		},
		"may write only EndpointSlices managed by this module": func() error {
			return controller.Delete(t.Context(), foreign, client.DryRunAll)
		},
		"may write only its leader-election Lease": func() error {
			return controller.Create(t.Context(), agentLease("probe-node"), client.DryRunAll)
		},
	}
	for name, probe := range probes {
		want := name
		if strings.HasSuffix(name, "names no node") {
			want = "names no node"
		}
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			policyRefusal(c, probe(), want)
		}, time.Minute, 200*time.Millisecond, "the policy is in force: %s", name)
	}
}
