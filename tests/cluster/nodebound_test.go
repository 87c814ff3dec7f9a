// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// Nodes of the node-bound tests. longNode is longer than a slice or Lease name leaves room for,
// so both names carry its digest instead (api/slicemeta).
var (
	nodeA    = "nb-node-a"
	nodeB    = "nb-node-b"
	longNode = strings.Join([]string{strings.Repeat("a", 63), strings.Repeat("b", 63), strings.Repeat("c", 63), strings.Repeat("d", 58)}, ".")
)

// ourSlice is the slice the agent of node publishes for port http of resource, owned by a
// ServiceWithHealthchecks of that name, with one ready endpoint on each of endpointNodes, each
// naming a Pod of the slice's namespace as its targetRef (images/agent/internal/sliceplan).
func ourSlice(ns, resource, node string, endpointNodes ...string) *discoveryv1.EndpointSlice {
	k := slicemeta.SliceKey{Resource: resource, Port: "http", Node: node}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: k.Name(), Labels: k.Labels(), Annotations: k.Annotations(),
			OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference(resource, types.UID("uid-of-"+resource))},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for i, n := range endpointNodes {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.1.0.%d", i+1)},
			NodeName:   ptr.To(n),
			TargetRef:  podRef(ns, fmt.Sprintf("%s-%d", resource, i)),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
		})
	}
	return s
}

// asChunk names s as further chunk k of its resource, port and node (api/slicemeta
// SliceKey.Chunk: "<resource>-<port>---<k>-<node>"), as the agent names the slices of a port
// whose endpoints on the node are more than --max-endpoints-per-slice.
func asChunk(s *discoveryv1.EndpointSlice, k int) *discoveryv1.EndpointSlice {
	key := slicemeta.SliceKey{Resource: s.Labels[wellknown.LabelResource], Port: s.Labels[wellknown.LabelPort], Node: s.Annotations[wellknown.AnnotationNode], Chunk: k}
	s.Name = key.Name()
	return s
}

// podRef is the targetRef the agent writes for the Pod name of namespace ns.
func podRef(ns, name string) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: name, UID: types.UID("uid-of-pod-" + name)}
}

// agentLease is the Lease the agent of node renews (images/agent/internal/lease), not yet owned.
func agentLease(node string) *coordinationv1.Lease {
	now := metav1.NewMicroTime(time.Now())
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: bundle.Namespace, Name: wellknown.AgentLeaseName(node),
			Annotations: map[string]string{wellknown.AnnotationNode: node},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
	}
	if len(node) <= 63 {
		l.Labels = map[string]string{wellknown.LabelNode: node}
	}
	return l
}

// ownedByNode makes the Lease owned by the Node n, as the agent does.
func ownedByNode(l *coordinationv1.Lease, n *corev1.Node) *coordinationv1.Lease {
	l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}}
	return l
}

// upsert creates obj as the administrator, or replaces the one that exists (tests of this package
// share one API server and the module namespace).
func upsert(ctx context.Context, obj client.Object) error {
	cur := obj.DeepCopyObject().(client.Object)
	err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), cur)
	switch {
	case apierrors.IsNotFound(err):
		return env.Client.Create(ctx, obj)
	case err != nil:
		return err
	}
	obj.SetResourceVersion(cur.GetResourceVersion())
	return env.Client.Update(ctx, obj)
}

// created creates obj as the administrator (the object an account then tries to change).
func created[T client.Object](t *testing.T, obj T) T {
	t.Helper()
	require.NoError(t, env.Client.Create(t.Context(), obj))
	return obj
}

// writeCase is one write as an account: refusal is a piece of the policy's message, or "" when
// the write must be admitted.
type writeCase struct {
	do      func(ctx context.Context, c client.Client) error
	refusal string
}

func runWrites(t *testing.T, c client.Client, cases map[string]writeCase) {
	t.Helper()
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.do(t.Context(), c)
			if tc.refusal == "" {
				assert.NoError(t, err)
				return
			}
			if policyRefusal(t, err, tc.refusal) {
				t.Log(err)
			}
		})
	}
}

// Messages of the policies (templates/agent/admission-policy.yaml, templates/controller/...).
const (
	refusedSystemNamespace = "may not write EndpointSlices in the system namespace"
	refusedNotManaged      = "may write only EndpointSlices managed by this module"
	refusedNames           = "must name one resource in its kubernetes.io/service-name label"
	refusedNodeAnnotation  = "may write only EndpointSlices whose network.deckhouse.io/node annotation"
	refusedEndpointNode    = "may publish only endpoints whose nodeName is that node"
	refusedNoNode          = "names no node"
	refusedLeaseHolder     = "may write only its own node Lease"
	refusedLeaseName       = "may write only the Lease swh-agent-"
	refusedLeaseOwner      = "may be owned only by the Node"
)

// TestTheAgentWritesOnlyItsOwnNodesSlicesAndLease runs as node-a's agent, with a token bound to
// an agent pod on node-a, under the chart's policies: its own node's slices (created, changed,
// taken over from a deleted resource of the same name, deleted; also further chunks, named
// <resource>-<port>---<k>-<node>) and its own Lease are admitted;
// slices in system namespaces (the forged kube-dns slice), slices that name another node or
// another resource or another manager, other nodes' slices and Leases, the controller's
// election Lease and made-up agent Leases are refused with the policy's message.
func TestTheAgentWritesOnlyItsOwnNodesSlicesAndLease(t *testing.T) {
	enforcePolicies(t)
	ctx := t.Context()
	tenant := env.CreateNamespaceForTest(t, "tenant")
	platform := env.CreateNamespaceForTest(t, "platform")
	ns := &corev1.Namespace{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Name: platform}, ns))
	ns.Labels["heritage"] = "deckhouse"
	require.NoError(t, env.Client.Update(ctx, ns))
	ensureNamespace(t, bundle.MonitoringNamespace)

	a := podClient(t, "agent", nodeA)
	nodeAObj, nodeBObj := ensureNode(t, nodeA), ensureNode(t, nodeB)
	b := podClient(t, "agent", nodeB)
	require.NoError(t, upsert(ctx, ownedByNode(agentLease(nodeB), nodeBObj)))
	election := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: bundle.Namespace, Name: bundle.ControllerElectionLease},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("controller-0_6c1f"), LeaseDurationSeconds: ptr.To[int32](15)},
	}
	if err := env.Client.Create(ctx, election); err != nil && !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}

	cases := map[string]writeCase{
		"it publishes, changes and removes a slice of its own node": {do: func(ctx context.Context, c client.Client) error {
			s := ourSlice(tenant, "web", nodeA, nodeA, nodeA)
			if err := c.Create(ctx, s); err != nil {
				return err
			}
			s.Endpoints[1].Conditions.Ready = ptr.To(false)
			if err := c.Update(ctx, s); err != nil {
				return err
			}
			uid, rv := s.UID, s.ResourceVersion
			return c.Delete(ctx, s, client.Preconditions{UID: &uid, ResourceVersion: &rv})
		}},
		"it publishes, changes and removes a further chunk of its own node's slice": {do: func(ctx context.Context, c client.Client) error {
			s := asChunk(ourSlice(tenant, "chunked", nodeA, nodeA, nodeA), 2)
			if s.Name != "chunked-http---2-"+nodeA {
				return fmt.Errorf("chunk 2 is named %s", s.Name)
			}
			if err := c.Create(ctx, s); err != nil {
				return err
			}
			s.Endpoints[0].Conditions.Ready = ptr.To(false)
			if err := c.Update(ctx, s); err != nil {
				return err
			}
			return c.Delete(ctx, s)
		}},
		"it takes over its node's slice left by a deleted resource of the same name": {do: func(ctx context.Context, c client.Client) error {
			s := created(t, ourSlice(tenant, "reborn", nodeA, nodeA))
			s.OwnerReferences = []metav1.OwnerReference{slicemeta.OwnerReference("reborn", "uid-of-the-new-reborn")}
			return c.Update(ctx, s)
		}},
		"it renews its own Lease, owned by its Node": {do: func(ctx context.Context, c client.Client) error {
			l := ownedByNode(agentLease(nodeA), nodeAObj)
			var cur coordinationv1.Lease
			switch err := c.Get(ctx, client.ObjectKeyFromObject(l), &cur); {
			case apierrors.IsNotFound(err):
				if err := c.Create(ctx, l); err != nil {
					return err
				}
			case err != nil:
				return err
			default:
				l = &cur
			}
			l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now().Add(time.Second)))
			return c.Update(ctx, l)
		}},
		// What a policy cannot see: whether the owner's UID is a live resource's and whether the
		// addresses are pods of this node. docs/SECURITY.md says what this allows and for how long.
		"in a tenant namespace it can forge a slice of its own node for any Service name": {do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, ourSlice(tenant, "not-a-resource", nodeA, nodeA), client.DryRunAll)
		}},

		"a kube-dns slice in kube-system with our labels, a made-up owner and its own node is refused": {refusal: refusedSystemNamespace + " kube-system", do: func(ctx context.Context, c client.Client) error {
			s := ourSlice("kube-system", "kube-dns", nodeA, nodeA)
			s.OwnerReferences[0].UID = "made-up"
			return c.Create(ctx, s)
		}},
		"a slice in a d8- namespace is refused": {refusal: refusedSystemNamespace + " " + bundle.MonitoringNamespace, do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, ourSlice(bundle.MonitoringNamespace, "grafana", nodeA, nodeA))
		}},
		"a slice in a namespace labelled heritage: deckhouse is refused": {refusal: refusedSystemNamespace + " " + platform, do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, ourSlice(platform, "web", nodeA, nodeA))
		}},
		"our slice with an endpoint on node-b is refused": {refusal: refusedEndpointNode, do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, ourSlice(tenant, "web", nodeA, nodeA, nodeB))
		}},
		"an endpoint without a node is refused": {refusal: refusedEndpointNode, do: func(ctx context.Context, c client.Client) error {
			s := ourSlice(tenant, "web", nodeA, nodeA)
			s.Endpoints[0].NodeName = nil
			return c.Create(ctx, s)
		}},
		"a slice annotated for node-b with endpoints on node-a is refused": {refusal: refusedNodeAnnotation, do: func(ctx context.Context, c client.Client) error {
			s := ourSlice(tenant, "web", nodeA, nodeA)
			s.Annotations[wellknown.AnnotationNode] = nodeB
			return c.Create(ctx, s)
		}},
		"a slice labelled for node-b is refused": {refusal: refusedNodeAnnotation, do: func(ctx context.Context, c client.Client) error {
			s := ourSlice(tenant, "web", nodeA, nodeA)
			s.Labels[wellknown.LabelNode] = nodeB
			return c.Create(ctx, s)
		}},
		"a slice keyed for node-b's cache is refused": {refusal: refusedNodeAnnotation, do: func(ctx context.Context, c client.Client) error {
			s := ourSlice(tenant, "web", nodeA, nodeA)
			s.Labels[wellknown.LabelNodeKey] = slicemeta.NodeKey(nodeB)
			return c.Create(ctx, s)
		}},
		"a slice without the node-key label, as agents before it wrote them, is admitted and keyed": {do: func(ctx context.Context, c client.Client) error {
			s := ourSlice(tenant, "older", nodeA, nodeA)
			delete(s.Labels, wellknown.LabelNodeKey)
			if err := c.Create(ctx, s); err != nil {
				return err
			}
			s.Labels[wellknown.LabelNodeKey] = slicemeta.NodeKey(nodeA)
			return c.Update(ctx, s)
		}},
		"a slice another controller manages is refused": {refusal: refusedNotManaged, do: func(ctx context.Context, c client.Client) error {
			s := ourSlice(tenant, "web", nodeA, nodeA)
			s.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
			return c.Create(ctx, s)
		}},
		"a slice routing another Service than its resource is refused": {refusal: refusedNames, do: func(ctx context.Context, c client.Client) error {
			s := ourSlice(tenant, "web", nodeA, nodeA)
			s.Labels[discoveryv1.LabelServiceName] = "postgres"
			return c.Create(ctx, s)
		}},
		"a slice owned by another resource is refused": {refusal: refusedNames, do: func(ctx context.Context, c client.Client) error {
			s := ourSlice(tenant, "web", nodeA, nodeA)
			s.OwnerReferences = []metav1.OwnerReference{slicemeta.OwnerReference("postgres", "uid-of-postgres")}
			return c.Create(ctx, s)
		}},
		"a slice without an owner is refused": {refusal: refusedNames, do: func(ctx context.Context, c client.Client) error {
			s := ourSlice(tenant, "web", nodeA, nodeA)
			s.OwnerReferences = nil
			return c.Create(ctx, s)
		}},
		"taking node-b's slice over is refused": {refusal: refusedNodeAnnotation, do: func(ctx context.Context, c client.Client) error {
			s := created(t, ourSlice(tenant, "api", nodeB, nodeB))
			s.Annotations[wellknown.AnnotationNode] = nodeA
			s.Labels[wellknown.LabelNode] = nodeA
			s.Endpoints[0].NodeName = ptr.To(nodeA)
			return c.Update(ctx, s)
		}},
		"a further chunk of node-b's slice is refused": {refusal: refusedNodeAnnotation, do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, asChunk(ourSlice(tenant, "chunked", nodeB, nodeB), 1))
		}},
		"deleting a further chunk of node-b's slice is refused": {refusal: refusedNodeAnnotation, do: func(ctx context.Context, c client.Client) error {
			return c.Delete(ctx, created(t, asChunk(ourSlice(tenant, "chunked", nodeB, nodeB), 3)))
		}},
		"deleting node-b's slice is refused": {refusal: refusedNodeAnnotation, do: func(ctx context.Context, c client.Client) error {
			return c.Delete(ctx, created(t, ourSlice(tenant, "db", nodeB, nodeB)))
		}},
		"the controller's election Lease is refused": {refusal: refusedLeaseHolder, do: func(ctx context.Context, c client.Client) error {
			var l coordinationv1.Lease
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(election), &l); err != nil {
				return err
			}
			l.Spec.HolderIdentity = ptr.To(nodeA)
			return c.Update(ctx, &l)
		}},
		"renewing node-b's Lease is refused": {refusal: refusedLeaseHolder, do: func(ctx context.Context, c client.Client) error {
			var l coordinationv1.Lease
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(agentLease(nodeB)), &l); err != nil {
				return err
			}
			l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
			return c.Update(ctx, &l)
		}},
		"a made-up agent Lease is refused": {refusal: refusedLeaseName + nodeA, do: func(ctx context.Context, c client.Client) error {
			l := agentLease(nodeA)
			l.Name = wellknown.AgentLeasePrefix + "made-up"
			return c.Create(ctx, l)
		}},
		"its Lease owned by node-b is refused": {refusal: refusedLeaseOwner, do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, ownedByNode(agentLease(nodeA), nodeBObj), client.DryRunAll)
		}},
	}
	runWrites(t, a, cases)

	t.Run("node-b's agent publishes its own slice", func(t *testing.T) {
		assert.NoError(t, b.Create(t.Context(), ourSlice(tenant, "web", nodeB, nodeB)))
	})
	t.Run("an agent on a node whose name is digested in object names writes its slices and Lease", func(t *testing.T) {
		long := podClient(t, "agent", longNode)
		s := ourSlice(tenant, "web", longNode, longNode)
		require.Contains(t, s.Name, wellknown.NodeDigest(longNode), "the slice's name carries the digest")
		assert.NoError(t, long.Create(t.Context(), s))
		l := ownedByNode(agentLease(longNode), ensureNode(t, longNode))
		require.Contains(t, l.Name, wellknown.NodeDigest(longNode), "the Lease's name carries the digest")
		assert.NoError(t, long.Create(t.Context(), l, client.DryRunAll))
		l.Name = wellknown.AgentLeaseName(nodeA)
		policyRefusal(t, long.Create(t.Context(), l, client.DryRunAll), refusedLeaseName+"<digest of its node name>")
		policyRefusal(t, long.Create(t.Context(), ourSlice(tenant, "web", nodeA, longNode)), refusedNodeAnnotation)
		require.Equal(t, slicemeta.NodeKey(longNode), s.Labels[wellknown.LabelNodeKey], "a digested node key")
		keyed := ourSlice(tenant, "api", longNode, longNode)
		keyed.Labels[wellknown.LabelNodeKey] = nodeA
		policyRefusal(t, long.Create(t.Context(), keyed), refusedNodeAnnotation)
	})
	t.Run("an agent whose token names no node writes nothing", func(t *testing.T) {
		c := impersonatedClient(t, "agent")
		policyRefusal(t, c.Create(t.Context(), ourSlice(tenant, "web", nodeA, nodeA)), refusedNoNode)
		policyRefusal(t, c.Create(t.Context(), ownedByNode(agentLease(nodeA), nodeAObj), client.DryRunAll), refusedNoNode)
	})
}

// TestTheControllerWritesOnlyWhatItOwns runs as the controller, with a token bound to a
// controller pod, under the chart's policies: the child Service of a resource (created, changed,
// deleted), an adoptable Service, the withdrawal of our slices' endpoints, the deletion of our
// slices and of built-in slices in a tenant namespace, and its election Lease are admitted; a
// Service it does not control, a Service in a system namespace, slices of other managers,
// built-in slices in system namespaces, a withdrawal that moves traffic, and any other Lease are
// refused with the policy's message.
func TestTheControllerWritesOnlyWhatItOwns(t *testing.T) {
	enforcePolicies(t)
	tenant := env.CreateNamespaceForTest(t, "tenant")
	c := podClient(t, "controller", "nb-control-plane")
	nodeAObj := ensureNode(t, nodeA)

	child := func(name string) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: name, OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference(name, types.UID("uid-of-"+name))}},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		}
	}
	foreign := func(name string, annotations map[string]string) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: name, Annotations: annotations},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		}
	}
	builtin := func(ns, service string) *discoveryv1.EndpointSlice {
		s := ourSlice(ns, service, nodeA, nodeA)
		s.Name = service + "-builtin"
		s.Labels = map[string]string{discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: service, UID: "uid-of-service-" + types.UID(service), Controller: ptr.To(true)}}
		return s
	}
	const (
		refusedCreate    = "may create only a Service controlled by the ServiceWithHealthchecks of the same name"
		refusedChange    = "may change only a Service controlled by the ServiceWithHealthchecks of the same name, or one annotated network.deckhouse.io/adopt"
		refusedDelete    = "may delete only a Service controlled by the ServiceWithHealthchecks of the same name"
		refusedSlices    = "may write only EndpointSlices managed by this module, and delete built-in ones"
		refusedRedirect  = "may change only the endpoints' conditions of an EndpointSlice"
		refusedLeaseName = "may write only its leader-election Lease " + bundle.ControllerElectionLease
	)

	cases := map[string]writeCase{
		"it creates, changes and deletes the child Service of a resource": {do: func(ctx context.Context, c client.Client) error {
			svc := child("web")
			if err := c.Create(ctx, svc); err != nil {
				return err
			}
			svc.Labels = map[string]string{"team": "a"}
			if err := c.Update(ctx, svc); err != nil {
				return err
			}
			return c.Delete(ctx, svc, client.Preconditions{UID: &svc.UID})
		}},
		"it adopts a Service annotated for adoption": {do: func(ctx context.Context, c client.Client) error {
			svc := created(t, foreign("legacy", map[string]string{wellknown.AnnotationAdopt: "true"}))
			svc.OwnerReferences = child("legacy").OwnerReferences
			return c.Update(ctx, svc)
		}},
		"it withdraws the endpoints of our slice": {do: func(ctx context.Context, c client.Client) error {
			s := created(t, ourSlice(tenant, "web", nodeA, nodeA, nodeA))
			for i := range s.Endpoints {
				s.Endpoints[i].Conditions.Ready, s.Endpoints[i].Conditions.Serving = ptr.To(false), ptr.To(false)
			}
			return c.Update(ctx, s)
		}},
		"it deletes our slice": {do: func(ctx context.Context, c client.Client) error {
			s := created(t, ourSlice(tenant, "gone", nodeA, nodeA))
			return c.Delete(ctx, s, client.Preconditions{UID: &s.UID, ResourceVersion: &s.ResourceVersion})
		}},
		"it deletes a built-in slice of an adopted Service": {do: func(ctx context.Context, c client.Client) error {
			return c.Delete(ctx, created(t, builtin(tenant, "legacy")))
		}},
		"it holds its election Lease": {do: func(ctx context.Context, c client.Client) error {
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: bundle.Namespace, Name: bundle.ControllerElectionLease}}
			switch err := c.Get(ctx, client.ObjectKeyFromObject(l), l); {
			case apierrors.IsNotFound(err):
				if err := c.Create(ctx, l); err != nil {
					return err
				}
			case err != nil:
				return err
			}
			l.Spec.HolderIdentity = ptr.To("controller-1_9d2e")
			return c.Update(ctx, l)
		}},

		"the child Service of a resource in kube-system is refused": {refusal: "may not create or change Services in the system namespace kube-system", do: func(ctx context.Context, c client.Client) error {
			svc := child("dns")
			svc.Namespace = "kube-system"
			return c.Create(ctx, svc)
		}},
		"a Service without its owner reference is refused": {refusal: refusedCreate, do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, foreign("plain", nil))
		}},
		"a Service owned by a resource of another name is refused": {refusal: refusedCreate, do: func(ctx context.Context, c client.Client) error {
			svc := child("kubernetes")
			svc.Name = "api"
			return c.Create(ctx, svc)
		}},
		"changing a Service it does not control is refused": {refusal: refusedChange, do: func(ctx context.Context, c client.Client) error {
			svc := created(t, foreign("theirs", nil))
			svc.Spec.Selector = nil
			svc.OwnerReferences = child("theirs").OwnerReferences
			return c.Update(ctx, svc)
		}},
		"deleting an adoptable Service it does not control yet is refused": {refusal: refusedDelete, do: func(ctx context.Context, c client.Client) error {
			return c.Delete(ctx, created(t, foreign("not-yet", map[string]string{wellknown.AnnotationAdopt: "true"})))
		}},
		"changing a built-in slice is refused": {refusal: refusedSlices, do: func(ctx context.Context, c client.Client) error {
			s := created(t, builtin(tenant, "plain"))
			s.Endpoints[0].Conditions.Ready = ptr.To(false)
			return c.Update(ctx, s)
		}},
		"deleting a built-in slice in kube-system is refused": {refusal: refusedSlices, do: func(ctx context.Context, c client.Client) error {
			return c.Delete(ctx, created(t, builtin("kube-system", "kube-dns")))
		}},
		"deleting another controller's slice is refused": {refusal: refusedSlices, do: func(ctx context.Context, c client.Client) error {
			s := ourSlice(tenant, "mesh", nodeA, nodeA)
			s.Labels[discoveryv1.LabelManagedBy] = "mesh-controller.example.com"
			return c.Delete(ctx, created(t, s))
		}},
		"pointing our slice's endpoint at another address is refused": {refusal: refusedRedirect, do: func(ctx context.Context, c client.Client) error {
			s := created(t, ourSlice(tenant, "redirect", nodeA, nodeA))
			s.Endpoints[0].Addresses = []string{"192.0.2.66"}
			return c.Update(ctx, s)
		}},
		"relabelling our slice for another Service is refused": {refusal: refusedRedirect, do: func(ctx context.Context, c client.Client) error {
			s := created(t, ourSlice(tenant, "relabel", nodeA, nodeA))
			s.Labels[discoveryv1.LabelServiceName] = "kubernetes"
			return c.Update(ctx, s)
		}},
		"renewing an agent's Lease is refused": {refusal: refusedLeaseName, do: func(ctx context.Context, c client.Client) error {
			l := ownedByNode(agentLease(nodeA), nodeAObj)
			if err := upsert(ctx, l); err != nil {
				return err
			}
			l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now().Add(time.Minute)))
			return c.Update(ctx, l)
		}},
		"another Lease is refused": {refusal: refusedLeaseName, do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: bundle.Namespace, Name: "other-controller"}})
		}},
	}
	runWrites(t, c, cases)
}
