// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package traffic_test

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
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// forgedEvent is the reason of the controller's Event for a deleted forged slice.
const forgedEvent = "ForgedEndpointSlice"

// applyAgentAdmission applies the chart's rendered RBAC and the agent's admission policies
// (templates/agent/admission-policy.yaml: they judge only the agent's ServiceAccount, so the
// stack's programs, which run as the administrator, are not affected) and removes the policies
// when the test ends.
func applyAgentAdmission(t *testing.T, s *stack.Stack) {
	t.Helper()
	objs, err := bundle.ValueSets()[bundle.SetDefaults].Render()
	require.NoError(t, err)
	var applied []client.Object
	for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		for _, obj := range objs.OfKind(kind) {
			if ns := obj.GetNamespace(); ns != "" && ns != bundle.Namespace {
				continue
			}
			if strings.HasPrefix(kind, "ValidatingAdmissionPolicy") && !strings.Contains(obj.GetName(), "-agent-") {
				continue
			}
			require.NoError(t, s.Apply(t.Context(), bundle.Namespace, obj))
			applied = append(applied, obj)
		}
	}
	t.Cleanup(func() {
		for _, obj := range applied {
			if strings.HasPrefix(obj.GetObjectKind().GroupVersionKind().Kind, "ValidatingAdmissionPolicy") {
				_ = s.Cluster.Env.Client.Delete(context.WithoutCancel(t.Context()), obj)
			}
		}
	})
}

// agentOf is a client that authenticates as node's agent does: the agent ServiceAccount with a
// token bound to a Pod of that account on node, so the API server gives it the node claim the
// agent's policies key on (the identity a compromised agent of that node holds).
func agentOf(t *testing.T, c *cluster.Cluster, node string) client.Client {
	t.Helper()
	ctx := t.Context()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: bundle.Namespace, GenerateName: "agent-"},
		Spec: corev1.PodSpec{
			ServiceAccountName: "agent", NodeName: node, AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "agent", Image: bundle.GlobalRegistryBase + "@" + bundle.AgentDigest}},
		},
	}
	require.NoError(t, c.Env.Client.Create(ctx, pod))
	t.Cleanup(func() { _ = c.Env.Client.Delete(context.WithoutCancel(ctx), pod) })
	cs, err := kubernetes.NewForConfig(c.Env.Config)
	require.NoError(t, err)
	tr, err := cs.CoreV1().ServiceAccounts(bundle.Namespace).CreateToken(ctx, "agent", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID},
			ExpirationSeconds: ptr.To[int64](3600),
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	cfg := rest.AnonymousClientConfig(c.Env.Config)
	cfg.BearerToken = tr.Status.Token
	ac, err := client.New(cfg, client.Options{Scheme: c.Env.Scheme})
	require.NoError(t, err)
	review := &authenticationv1.SelfSubjectReview{}
	require.NoError(t, ac.Create(ctx, review))
	require.Equal(t, authenticationv1.ExtraValue{node}, review.Status.UserInfo.Extra["authentication.kubernetes.io/node-name"],
		"the token carries the node claim")
	return ac
}

// forgedSlice is a slice of resource swh's port http on node as only a forger writes it: the
// labels, annotation and owner reference the agent's policy asks for, one endpoint on node whose
// targetRef names the real Pod honest (kind Pod, its namespace, name and UID) but whose address
// is addr, an IP that is not the Pod's.
func forgedSlice(swh *v1alpha1.ServiceWithHealthchecks, node string, honest *cluster.Pod, uid types.UID, addr string) *discoveryv1.EndpointSlice {
	key := slicemeta.SliceKey{Resource: swh.Name, Port: "http", Node: node}
	// Without the node-key label (the policy asks for it only if present): node's honest agent
	// caches only its slices by that label and would delete an unknown one of its own at once;
	// a forger who keeps out of its sight leaves the removal to the controller's audit.
	sliceLabels := key.Labels()
	delete(sliceLabels, wellknown.LabelNodeKey)
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: swh.Namespace, Name: forgedName(key), Labels: sliceLabels, Annotations: key.Annotations(),
			OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference(swh.Name, swh.UID)},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{addr},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(node),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: honest.Namespace, Name: honest.Name, UID: uid},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
}

// Issue 28 part 2, end to end: a forged endpoint is removed and its traffic stops. A resource
// with two honest pods serves a request loop through the real kube-proxy. Then, as node-a's
// agent (its pod-bound token, the chart's RBAC and the agent's admission policies in force),
// a slice for the resource is written whose endpoint names a real Pod of the namespace but
// the address of a server in a network namespace the test made (a "pod" of another namespace,
// answering with its own name): admission admits it, only the controller's audit can catch
// it. The audit deletes it (polled, with a deadline) and records ForgedEndpointSlice; after
// that no request reaches the forged server, and no request of the loop fails throughout.
func TestForgedSliceIsDeletedAndItsTrafficStopsWhileHonestEndpointsServe(t *testing.T) {
	s := testStack(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "forged")
	attackerNS := c.Env.CreateNamespaceForTest(t, "forger")
	applyAgentAdmission(t, s)
	agent := agentOf(t, c, "node-a")

	pods, swh, _ := honestWeb(t, c, ns)
	forger := c.AddPod(t, cluster.PodSpec{Namespace: attackerNS, Name: "forger", Node: "node-a", ContainerPorts: webPorts})
	forgerServer := forger.ServeHTTP(t, 8080)
	w := watchSlices(t, c, ns)
	loop := c.Traffic(t, cluster.TrafficOptions{Service: ns + "/web", Port: 80, Duration: loopFor})
	logTimelineOnFailure(t, w, loop)
	kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)

	obj, err := pods[0].Object(t.Context())
	require.NoError(t, err)
	forged := forgedSlice(swh, "node-a", pods[0], obj.UID, ip(forger))
	// The agent's policies are in force (the same slice without its targetRef is refused), and
	// the forged slice passes them.
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		bare := forged.DeepCopy()
		bare.Endpoints[0].TargetRef = nil
		err := agent.Create(t.Context(), bare, client.DryRunAll)
		if assert.Error(ct, err) {
			assert.True(ct, apierrors.IsForbidden(err), "%v", err)
			assert.Contains(ct, err.Error(), "no targetRef")
		}
	}, waitFor, poll, "the agent's admission policies are in force")
	written := time.Now()
	require.NoError(t, agent.Create(t.Context(), forged), "admission admits the forged slice: only the audit can catch it")

	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		err := c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(forged), &discoveryv1.EndpointSlice{})
		assert.True(ct, apierrors.IsNotFound(err), "the forged slice is still there (%v)", err)
	}, waitFor, poll, "the audit deletes the forged slice")
	removed := time.Now()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		var events eventsv1.EventList
		require.NoError(ct, c.Env.Client.List(t.Context(), &events, client.InNamespace(ns)))
		found := false
		for _, e := range events.Items {
			found = found || (e.Reason == forgedEvent && strings.Contains(e.Note, forged.Name) && strings.Contains(e.Note, ip(forger)))
		}
		assert.True(ct, found, "an Event %s names the slice and the forged address", forgedEvent)
	}, waitFor, poll, "the controller records the forged slice")

	// The forged address leaves kube-proxy's rules: poll until the forged server's counter stops
	// growing over a batch of requests, then it stays constant over a further batch.
	settled := forgerServer.Hits()
	for deadline := time.Now().Add(waitFor); ; {
		kit.WaitRequestsAfter(t, loop, time.Now(), minInWindow)
		now := forgerServer.Hits()
		if now == settled {
			break
		}
		settled = now
		require.True(t, time.Now().Before(deadline), "requests stop reaching the forged server (%d so far)", now)
	}
	quiet := time.Now()
	kit.WaitRequestsAfter(t, loop, quiet, 4*minInWindow)
	res := loop.Stop()
	assert.Equal(t, settled, forgerServer.Hits(), "no request reaches the forged server after its slice is gone")
	after := res.Since(quiet)
	assert.NotContains(t, after.ByPod(), forger.Key(), "requests after the removal: %s", after)
	assert.ElementsMatch(t, []string{pods[0].Key(), pods[1].Key()}, after.Pods(), "both honest pods serve")
	assert.Empty(t, res.Failed(), "requests across the forgery and its removal: %s; failed: %s", res, e2e.Failures(res))
	got, err := e2e.EndpointsOf(t.Context(), c, ns, "web")
	require.NoError(t, err)
	assert.Equal(t, map[string]map[string]string{
		"web-http-node-a": {ip(pods[0]): "TTF"},
		"web-http-node-b": {ip(pods[1]): "TTF"},
	}, got, "the honest slices stay")
	t.Logf("forged slice removed %s after its write; the forged server answered %d requests; %d requests in the loop, %d failed",
		removed.Sub(written).Round(time.Millisecond), settled, len(res), len(res.Failed()))
}

// forgedName is the name a forger of node key.Node gives its slice: a further chunk of the
// node's slice of the port (the agents' admission policy admits only names of the node's own
// slices, issue 40, and the honest agent holds the common name). No agent publishes chunk 9
// of a port of one pod.
func forgedName(key slicemeta.SliceKey) string {
	key.Chunk = 9
	return key.Name()
}

// honestWeb is the honest side of the forgery tests: pods web-0 on node-a and web-1 on node-b
// serving HTTP on 8080 and resource web probing them, both published ready and routed. It
// returns the pods, the resource and the slices as published (name → address → conditions).
func honestWeb(t *testing.T, c *cluster.Cluster, ns string) ([]*cluster.Pod, *v1alpha1.ServiceWithHealthchecks, map[string]map[string]string) {
	t.Helper()
	labels := map[string]string{"app": "web"}
	pods := []*cluster.Pod{
		c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-0", Node: "node-a", Labels: labels, ContainerPorts: webPorts}),
		c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-1", Node: "node-b", Labels: labels, ContainerPorts: webPorts}),
	}
	for _, p := range pods {
		p.ServeHTTP(t, 8080)
	}
	swh := kit.Resource(ns, "web", labels, []v1alpha1.ServicePort{e2e.ServicePort("http", 80, intstr.FromInt32(8080))},
		kit.HTTPProbe(intstr.FromInt32(8080)))
	createResource(t, c, swh)
	honest := map[string]map[string]string{
		"web-http-node-a": {ip(pods[0]): "TTF"},
		"web-http-node-b": {ip(pods[1]): "TTF"},
	}
	kit.EventuallyEndpoints(t, c, ns, "web", honest)
	c.WaitProgrammed(t, ns+"/web", 80, pods...)
	return pods, swh, honest
}
