// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/notready"
	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// Messages of the agent's slice policy about what a slice says (templates/agent/admission-policy.yaml).
const (
	refusedReservedKubernetes = "may not write an EndpointSlice for the Service default/kubernetes: the platform reserves it, because it is the API server's own Service"
	refusedTargetRef          = "may publish only endpoints whose targetRef names a Pod (kind Pod, with its name and UID) of the EndpointSlice's own namespace"
)

// forgedKubernetesSlice is a slice of node for the API server's Service default/kubernetes with
// everything the other rules ask for forged: this module's labels, a ServiceWithHealthchecks
// owner reference named kubernetes, the node's annotation and labels, an endpoint on the node
// naming a Pod of default. Only the reserved-Service rule can refuse it.
func forgedKubernetesSlice(node string) *discoveryv1.EndpointSlice {
	s := ourSlice("default", "kubernetes", node, node)
	s.Name = slicemeta.SliceKey{Resource: "kubernetes", Port: "https", Node: node}.Name()
	s.Labels = slicemeta.SliceKey{Resource: "kubernetes", Port: "https", Node: node}.Labels()
	s.Ports[0].Name, s.Ports[0].Port = ptr.To("https"), ptr.To[int32](6443)
	s.OwnerReferences[0].UID = "forged"
	s.Endpoints[0].Addresses = []string{"192.0.2.10"}
	return s
}

// TestForgedSliceForTheAPIServersServiceIsRefused runs as node-a's agent (its pod-bound token)
// under the chart's policies: a slice for default/kubernetes whose labels, owner reference,
// node and targetRef are all forged to pass the other rules is refused, with a message that
// names the Service and says why; so is its takeover of an existing one. The same identity's
// honest slice is admitted in the same test.
func TestForgedSliceForTheAPIServersServiceIsRefused(t *testing.T) {
	enforcePolicies(t)
	tenant := env.CreateNamespaceForTest(t, "tenant")
	a := podClient(t, "agent", nodeA)
	// On a chart without the rule the forged slices are admitted: remove them for the other tests.
	t.Cleanup(func() {
		_ = env.Client.DeleteAllOf(context.WithoutCancel(t.Context()), &discoveryv1.EndpointSlice{}, client.InNamespace("default"),
			client.MatchingLabels{discoveryv1.LabelServiceName: "kubernetes", discoveryv1.LabelManagedBy: wellknown.ManagedBy})
	})

	runWrites(t, a, map[string]writeCase{
		"the honest slice of its own node is admitted": {do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, ourSlice(tenant, "web", nodeA, nodeA))
		}},
		"the honest slice of a resource named kubernetes in a tenant namespace is admitted": {do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, ourSlice(tenant, "kubernetes", nodeA, nodeA), client.DryRunAll)
		}},
		"a forged slice for default/kubernetes is refused": {refusal: refusedReservedKubernetes, do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, forgedKubernetesSlice(nodeA))
		}},
		"a forged slice for default/kubernetes named like another resource's is refused": {refusal: refusedReservedKubernetes, do: func(ctx context.Context, c client.Client) error {
			s := forgedKubernetesSlice(nodeA)
			s.Name = "innocent-http-" + nodeA
			return c.Create(ctx, s)
		}},
		"turning its own slice in default into one for kubernetes is refused": {refusal: refusedReservedKubernetes, do: func(ctx context.Context, c client.Client) error {
			s := created(t, ourSlice("default", "forged-web", nodeA, nodeA))
			t.Cleanup(func() { _ = env.Client.Delete(context.WithoutCancel(ctx), s) })
			k := forgedKubernetesSlice(nodeA)
			s.Labels, s.OwnerReferences = k.Labels, k.OwnerReferences
			return c.Update(ctx, s)
		}},
	})
	var list discoveryv1.EndpointSliceList
	require.NoError(t, env.Client.List(t.Context(), &list, client.InNamespace("default"),
		client.MatchingLabels{discoveryv1.LabelServiceName: "kubernetes", discoveryv1.LabelManagedBy: wellknown.ManagedBy}))
	assert.Empty(t, list.Items, "no slice of this module routes default/kubernetes")
}

// TestForgedEndpointsThatNameNoPodOfTheSlicesNamespaceAreRefused runs as node-a's agent under
// the chart's policies: an endpoint at an arbitrary address with no targetRef, with a targetRef
// that is not a Pod (a Service, a Node, a "Pod" of another API group), one naming a Pod of
// another namespace, or a Pod without name or UID, is refused with a message that says which
// endpoint and what is wrong with it; the honest slice, and an honest update of it, by the same
// identity are admitted.
func TestForgedEndpointsThatNameNoPodOfTheSlicesNamespaceAreRefused(t *testing.T) {
	enforcePolicies(t)
	tenant := env.CreateNamespaceForTest(t, "tenant")
	other := env.CreateNamespaceForTest(t, "victim")
	a := podClient(t, "agent", nodeA)

	forged := func(change func(*discoveryv1.Endpoint)) func(ctx context.Context, c client.Client) error {
		return func(ctx context.Context, c client.Client) error {
			s := ourSlice(tenant, "web", nodeA, nodeA, nodeA)
			s.Endpoints[1].Addresses = []string{"192.0.2.66"}
			change(&s.Endpoints[1])
			return c.Create(ctx, s, client.DryRunAll)
		}
	}
	refusal := func(why string) string {
		return refusedTargetRef + " " + tenant + ", as it always does: an endpoint that names no Pod of this namespace could send the Service's traffic to any address; refused: the endpoint 192.0.2.66 has " + why
	}
	runWrites(t, a, map[string]writeCase{
		"the honest slice is admitted and updated": {do: func(ctx context.Context, c client.Client) error {
			s := ourSlice(tenant, "honest", nodeA, nodeA, nodeA)
			if err := c.Create(ctx, s); err != nil {
				return err
			}
			s.Endpoints[1].Conditions.Ready = ptr.To(false)
			s.Endpoints = append(s.Endpoints, ourSlice(tenant, "moved", nodeA, nodeA).Endpoints[0])
			return c.Update(ctx, s)
		}},
		"a targetRef of kind Pod with apiVersion v1 is admitted": {do: forged(func(e *discoveryv1.Endpoint) {
			e.TargetRef.APIVersion = "v1"
		})},
		"an endpoint without a targetRef is refused": {refusal: refusal("no targetRef"), do: forged(func(e *discoveryv1.Endpoint) {
			e.TargetRef = nil
		})},
		"a targetRef to a Service is refused": {refusal: refusal("a targetRef of kind Service, not Pod"), do: forged(func(e *discoveryv1.Endpoint) {
			e.TargetRef.Kind = "Service"
		})},
		"a targetRef to a Node is refused": {refusal: refusal("a targetRef of kind Node, not Pod"), do: forged(func(e *discoveryv1.Endpoint) {
			e.TargetRef = &corev1.ObjectReference{Kind: "Node", Name: nodeA, UID: "uid-of-node"}
		})},
		"a targetRef without a kind is refused": {refusal: refusal("a targetRef of kind (none), not Pod"), do: forged(func(e *discoveryv1.Endpoint) {
			e.TargetRef.Kind = ""
		})},
		"a Pod of another API group is refused": {refusal: refusal("a targetRef of API version example.com/v1, not v1"), do: forged(func(e *discoveryv1.Endpoint) {
			e.TargetRef.APIVersion = "example.com/v1"
		})},
		"a Pod of another namespace is refused": {refusal: refusal("a targetRef to a Pod of the namespace " + other), do: forged(func(e *discoveryv1.Endpoint) {
			e.TargetRef.Namespace = other
		})},
		"a Pod without a namespace is refused": {refusal: refusal("a targetRef to a Pod of the namespace (none)"), do: forged(func(e *discoveryv1.Endpoint) {
			e.TargetRef.Namespace = ""
		})},
		"a Pod without a UID is refused": {refusal: refusal("a targetRef without the Pod's name or UID"), do: forged(func(e *discoveryv1.Endpoint) {
			e.TargetRef.UID = ""
		})},
		"a Pod without a name is refused": {refusal: refusal("a targetRef without the Pod's name or UID"), do: forged(func(e *discoveryv1.Endpoint) {
			e.TargetRef.Name = ""
		})},
		"adding an endpoint without a targetRef to its honest slice is refused": {refusal: refusal("no targetRef"), do: func(ctx context.Context, c client.Client) error {
			s := ourSlice(tenant, "grown", nodeA, nodeA)
			if err := c.Create(ctx, s); err != nil {
				return err
			}
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{"192.0.2.66"}, NodeName: ptr.To(nodeA)})
			return c.Update(ctx, s)
		}},
	})
}

// TestForgedEndpointRuleLeavesNoAgentStuckOnASliceWrittenBeforeIt is the upgrade rule: slices
// of node-a written before the targetRef and reserved-Service rules (here by the administrator,
// with an endpoint without targetRef and without the node-key label, as an older release or a
// hand could have left them) never leave node-a's agent stuck. Its start-up labelling (an
// update that keeps the endpoints) and its replacement of the endpoints with its own (each
// naming its Pod) are admitted, and so is its deletion of such a slice; a legacy slice for
// default/kubernetes can be deleted but not kept alive. A change of a legacy slice that keeps
// a forged endpoint is refused.
func TestForgedEndpointRuleLeavesNoAgentStuckOnASliceWrittenBeforeIt(t *testing.T) {
	enforcePolicies(t)
	tenant := env.CreateNamespaceForTest(t, "tenant")
	a := podClient(t, "agent", nodeA)

	legacy := func(resource string) *discoveryv1.EndpointSlice {
		s := ourSlice(tenant, resource, nodeA, nodeA, nodeA)
		delete(s.Labels, wellknown.LabelNodeKey)
		s.Endpoints[1].TargetRef = nil
		return created(t, s)
	}
	refusal := refusedTargetRef + " " + tenant + ", as it always does: an endpoint that names no Pod of this namespace could send the Service's traffic to any address; refused: the endpoint 10.1.0.2 has no targetRef"

	runWrites(t, a, map[string]writeCase{
		"it labels a legacy slice at start, keeping its endpoints, then replaces them with its own": {do: func(ctx context.Context, c client.Client) error {
			s := legacy("upgraded")
			s.Labels[wellknown.LabelNodeKey] = slicemeta.NodeKey(nodeA)
			if err := c.Update(ctx, s); err != nil {
				return err
			}
			s.Endpoints = ourSlice(tenant, "upgraded", nodeA, nodeA, nodeA).Endpoints
			if err := c.Update(ctx, s); err != nil {
				return err
			}
			var got discoveryv1.EndpointSlice
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(s), &got); err != nil {
				return err
			}
			for _, e := range got.Endpoints {
				if e.TargetRef == nil || e.TargetRef.Kind != "Pod" {
					t.Errorf("endpoint %v names no Pod after the agent's update", e.Addresses)
				}
			}
			return nil
		}},
		"it takes over a legacy slice with its own content in one update": {do: func(ctx context.Context, c client.Client) error {
			s := legacy("taken-over")
			want := ourSlice(tenant, "taken-over", nodeA, nodeA)
			s.Labels, s.Endpoints = want.Labels, want.Endpoints
			return c.Update(ctx, s)
		}},
		"it deletes a legacy slice": {do: func(ctx context.Context, c client.Client) error {
			s := legacy("removed")
			return c.Delete(ctx, s, client.Preconditions{UID: &s.UID, ResourceVersion: &s.ResourceVersion})
		}},
		"it deletes a legacy slice for default/kubernetes": {do: func(ctx context.Context, c client.Client) error {
			s := forgedKubernetesSlice(nodeA)
			s.Name = "kubernetes-old-" + nodeA
			created(t, s)
			if err := c.Delete(ctx, s); err != nil {
				return err
			}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(s), s); !apierrors.IsNotFound(err) {
				t.Errorf("the legacy default/kubernetes slice is still there (%v)", err)
			}
			return nil
		}},

		"keeping a legacy slice for default/kubernetes alive is refused": {refusal: refusedReservedKubernetes, do: func(ctx context.Context, c client.Client) error {
			s := forgedKubernetesSlice(nodeA)
			s.Name = "kubernetes-legacy-" + nodeA
			delete(s.Labels, wellknown.LabelNodeKey)
			created(t, s)
			t.Cleanup(func() { _ = env.Client.Delete(context.WithoutCancel(ctx), s) })
			s.Labels[wellknown.LabelNodeKey] = slicemeta.NodeKey(nodeA)
			return c.Update(ctx, s)
		}},
		"changing a legacy slice while keeping its endpoint without a targetRef is refused": {refusal: refusal, do: func(ctx context.Context, c client.Client) error {
			s := legacy("kept-forged")
			s.Endpoints[0].Conditions.Ready = ptr.To(false)
			return c.Update(ctx, s)
		}},
		"moving a legacy slice's endpoints to another Service is refused": {refusal: refusal, do: func(ctx context.Context, c client.Client) error {
			s := legacy("relabelled")
			other := ourSlice(tenant, "other", nodeA, nodeA)
			s.Labels, s.OwnerReferences = other.Labels, other.OwnerReferences
			return c.Update(ctx, s)
		}},
	})
}

// TestLegacySliceNoAgentMayChangeIsLeftToTheControllersAudit: a slice of node-a written before
// the node-bound rules with an endpoint that names no node (by hand or by a release before
// endpoints carried nodeName) fails a rule the agent's policy checks on the object before the
// write too, so node-a's agent may neither label it, replace its endpoints, nor delete it: no
// retry of the agent can get past it (its start-up labelling skips a refused slice:
// images/agent/internal/agent TestLegacySliceWhoseLabellingIsRefusedDoesNotStopTheAgent). The
// controller's delete of it, with the preconditions its audit sends, is admitted: the audit
// deletes such a slice (an endpoint without nodeName is one no agent writes,
// images/controller/internal/controller TestLegacySliceWithAnEndpointNamingNoNodeIsDeletedByTheAudit),
// and the agent then creates its own.
func TestLegacySliceNoAgentMayChangeIsLeftToTheControllersAudit(t *testing.T) {
	enforcePolicies(t)
	tenant := env.CreateNamespaceForTest(t, "tenant")
	a := podClient(t, "agent", nodeA)
	ctl := podClient(t, "controller", "legacy-control-plane")

	legacy := func(resource string) *discoveryv1.EndpointSlice {
		s := ourSlice(tenant, resource, nodeA, nodeA)
		delete(s.Labels, wellknown.LabelNodeKey)
		s.Endpoints[0].NodeName = nil
		return created(t, s)
	}
	runWrites(t, a, map[string]writeCase{
		"the agent's start-up labelling of it is refused": {refusal: refusedEndpointNode, do: func(ctx context.Context, c client.Client) error {
			s := legacy("labelled")
			s.Labels[wellknown.LabelNodeKey] = slicemeta.NodeKey(nodeA)
			return c.Update(ctx, s)
		}},
		"the agent's replacement of its endpoints is refused": {refusal: refusedEndpointNode, do: func(ctx context.Context, c client.Client) error {
			s := legacy("replaced")
			want := ourSlice(tenant, "replaced", nodeA, nodeA)
			s.Labels, s.Endpoints = want.Labels, want.Endpoints
			return c.Update(ctx, s)
		}},
		"the agent's delete of it is refused": {refusal: refusedEndpointNode, do: func(ctx context.Context, c client.Client) error {
			s := legacy("deleted")
			return c.Delete(ctx, s, client.Preconditions{UID: &s.UID, ResourceVersion: &s.ResourceVersion})
		}},
	})
	runWrites(t, ctl, map[string]writeCase{
		"the controller's delete of it, with preconditions, is admitted": {do: func(ctx context.Context, c client.Client) error {
			s := legacy("audited")
			if err := c.Delete(ctx, s, client.Preconditions{UID: &s.UID, ResourceVersion: &s.ResourceVersion}); err != nil {
				return err
			}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(s), s); !apierrors.IsNotFound(err) {
				t.Errorf("the legacy slice is still there (%v)", err)
			}
			return nil
		}},
	})
	// With the legacy slice gone, the agent's own slice for the port is admitted.
	require.NoError(t, a.Create(t.Context(), ourSlice(tenant, "audited", nodeA, nodeA)), "the agent creates its own slice in its place")
}

// TestNotReadyNoteOverItsBoundIsRefused runs as node-a's agent under the chart's policies: the
// note of why endpoints are out (api/notready) is admitted up to its bound, in characters, and a
// longer one is refused with a message that names the bound; a slice may also drop its note.
func TestNotReadyNoteOverItsBoundIsRefused(t *testing.T) {
	enforcePolicies(t)
	tenant := env.CreateNamespaceForTest(t, "tenant")
	a := podClient(t, "agent", nodeA)
	withNote := func(name string, size int) *discoveryv1.EndpointSlice {
		s := ourSlice(tenant, name, nodeA, nodeA)
		s.Annotations[notready.Annotation] = `{"` + name + `-0":"` + strings.Repeat("é", size-len(`{"`+name+`-0":""}`)) + `"}`
		require.Equal(t, size, utf8.RuneCountInString(s.Annotations[notready.Annotation]))
		return s
	}
	runWrites(t, a, map[string]writeCase{
		"an honest note is admitted, changed and removed": {do: func(ctx context.Context, c client.Client) error {
			s := ourSlice(tenant, "noted", nodeA, nodeA)
			s.Endpoints[0].Conditions.Ready = ptr.To(false)
			s.Annotations[notready.Annotation] = notready.Encode(map[string]string{"noted-0": "probe 0 (HTTP): HTTP status 503"})
			if err := c.Create(ctx, s); err != nil {
				return err
			}
			s.Annotations[notready.Annotation] = notready.Encode(map[string]string{"noted-0": "probe 0 (HTTP): connection refused"})
			if err := c.Update(ctx, s); err != nil {
				return err
			}
			delete(s.Annotations, notready.Annotation)
			s.Endpoints[0].Conditions.Ready = ptr.To(true)
			return c.Update(ctx, s)
		}},
		"a note of exactly the bound is admitted": {do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, withNote("edge", notready.MaxAnnotationBytes), client.DryRunAll)
		}},
		"a note over the bound is refused": {refusal: refusedNoteSize, do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, withNote("big", notready.MaxAnnotationBytes+1), client.DryRunAll)
		}},
		"growing a note over the bound is refused": {refusal: refusedNoteSize, do: func(ctx context.Context, c client.Client) error {
			s := created(t, ourSlice(tenant, "grows", nodeA, nodeA))
			s.Annotations[notready.Annotation] = withNote("grows", notready.MaxAnnotationBytes+1).Annotations[notready.Annotation]
			return c.Update(ctx, s)
		}},
	})
}

// refusedNoteSize is the agent's slice policy's message for a note over its bound.
const refusedNoteSize = "the network.deckhouse.io/not-ready-reasons annotation of an EndpointSlice the agent writes may be at most 16384 characters, not 16385"
