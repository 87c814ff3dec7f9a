// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package upgrade_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// accessKinds are the chart's objects that decide what the programs may do: the module
// namespace, the accounts, their RBAC and the admission policies with their bindings. The
// platform applies them with the programs (one Helm release), so a replacement applies the
// next version's before its programs start.
var accessKinds = []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
	"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}

// fieldOwner is the field manager the chart's objects are applied with (as Helm's would be one
// for every version).
const fieldOwner = "upgrade-test-chart"

// chartAccess renders the chart of dir with values and returns its accessKinds objects.
func chartAccess(dir string, values map[string]any) (bundle.Objects, error) {
	rendered, err := bundle.RenderDir(dir, values, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("rendering the chart of %s: %w", dir, err)
	}
	var out bundle.Objects
	for _, kind := range accessKinds {
		out = append(out, bundle.Objects(rendered).OfKind(kind)...)
	}
	return out, nil
}

// applyAccess applies the chart's access objects of the next version (server-side, one field
// manager: what the earlier version set and the next does not is dropped) and deletes those of
// the earlier version (prev, nil at the install) the next one no longer renders, as Helm does.
func applyAccess(t *testing.T, c *cluster.Cluster, next, prev bundle.Objects) {
	t.Helper()
	ctx := t.Context()
	for _, o := range next {
		obj := o.DeepCopy()
		obj.SetResourceVersion("")
		require.NoError(t, c.Env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner(fieldOwner), client.ForceOwnership),
			"applying %s %s/%s", obj.GetKind(), obj.GetNamespace(), obj.GetName())
	}
	for _, o := range prev {
		if next.Get(o.GetKind(), o.GetNamespace(), o.GetName()) != nil {
			continue
		}
		obj := o.DeepCopy()
		require.NoError(t, client.IgnoreNotFound(c.Env.Client.Delete(ctx, obj)), "deleting %s %s", obj.GetKind(), obj.GetName())
	}
}

// waitPoliciesInForce waits until the chart's admission policies refuse what they must: a
// malformed PostgreSQL credential Secret (every release has that policy) is refused by the
// module's policy. The API server learns policies through an informer; the chart's are
// applied in one batch, so one in force means the batch is.
func waitPoliciesInForce(t *testing.T, c *cluster.Cluster, objs bundle.Objects) {
	t.Helper()
	require.NotEmpty(t, objs.OfKind("ValidatingAdmissionPolicy"), "the chart renders admission policies")
	bad := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: bundle.Namespace, GenerateName: "malformed-"},
		Type:       "network.deckhouse.io/postgresql-credentials",
		Data:       map[string][]byte{"password": []byte("no user")},
	}
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		err := c.Env.Client.Create(t.Context(), bad.DeepCopy(), client.DryRunAll)
		assert.ErrorContains(ct, err, "ValidatingAdmissionPolicy '"+bundle.ModuleName+"-postgresql-credentials'", "a malformed credential Secret is refused")
	}, kit.WaitFor, kit.Poll)
}

// programKubeconfigs writes, for every program of the stack ("controller-<i>", "agent-<node>"),
// a kubeconfig that authenticates exactly as the chart's pod does: a TokenRequest token of the
// chart's ServiceAccount (controller, agent) bound to a Pod of that account on the program's
// node, which the API server turns into the user's node claim that the agents' policies check.
// The Pods stand for the Deployment's and the DaemonSet's pods and are never run; the token
// lives as long as its Pod (an hour at most, more than the test).
func programKubeconfigs(t *testing.T, c *cluster.Cluster, controllers int) map[string]string {
	t.Helper()
	ctx := t.Context()
	kube, err := kubernetes.NewForConfig(c.Env.Config)
	require.NoError(t, err)
	dir := t.TempDir()
	out := map[string]string{}
	write := func(program, sa, node string) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: bundle.Namespace, Name: program},
			Spec: corev1.PodSpec{
				ServiceAccountName: sa, NodeName: node, AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{Name: sa, Image: bundle.GlobalRegistryBase + "@" + bundle.AgentDigest}},
			},
		}
		require.NoError(t, c.Env.Client.Create(ctx, pod), "the pod of %s", program)
		tr, err := kube.CoreV1().ServiceAccounts(bundle.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{
				BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID},
				ExpirationSeconds: ptr.To[int64](3600),
			},
		}, metav1.CreateOptions{})
		require.NoError(t, err, "a token of %s bound to %s", sa, pod.Name)
		cfg := clientcmdapi.NewConfig()
		cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: c.Env.Config.Host, CertificateAuthorityData: c.Env.Config.CAData}
		cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
		cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
		cfg.CurrentContext = "c"
		path := filepath.Join(dir, program+".kubeconfig")
		require.NoError(t, clientcmd.WriteToFile(*cfg, path))
		out[program] = path
	}
	for i := range controllers {
		write("controller-"+strconv.Itoa(i), "controller", c.Nodes[i%len(c.Nodes)].Name)
	}
	for _, n := range c.Nodes {
		write("agent-"+n.Name, "agent", n.Name)
	}
	return out
}

// requireNoAdministrator asserts that the API server saw every program as its ServiceAccount:
// the stack's programs use the kubeconfigs of programKubeconfigs, whose users are no
// administrators (their requests pass RBAC and the policies).
func requireNoAdministrator(t *testing.T, kubeconfigs map[string]string) {
	t.Helper()
	for program, path := range kubeconfigs {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		require.NoError(t, err)
		cl, err := client.New(cfg, client.Options{})
		require.NoError(t, err)
		review := &authenticationv1.SelfSubjectReview{}
		require.NoError(t, cl.Create(t.Context(), review), "%s's token authenticates", program)
		user := review.Status.UserInfo
		sa := "agent"
		if strings.HasPrefix(program, "controller") {
			sa = "controller"
		}
		assert.Equal(t, "system:serviceaccount:"+bundle.Namespace+":"+sa, user.Username, "%s runs as its ServiceAccount", program)
		assert.False(t, slices.Contains(user.Groups, "system:masters"), "%s is no administrator", program)
		assert.Len(t, user.Extra["authentication.kubernetes.io/node-name"], 1, "%s's token names its node", program)
	}
}

// accessNames are the names of the admission policies among objs, for logs.
func accessNames(objs bundle.Objects) []string {
	var out []string
	for _, o := range objs {
		if o.GetKind() == "ValidatingAdmissionPolicy" {
			out = append(out, o.GetName())
		}
	}
	return out
}
