// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/notready"
	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// Messages of the agent's slice policy about names and bounds (templates/agent/admission-policy.yaml).
const (
	refusedSquat = "may create only EndpointSlices named as its node's slices are"
	refusedExtra = "the agent may write on an EndpointSlice only the labels"
)

// keyedSlice is ourSlice of node for the given key's resource and port, named and shaped as the
// agent of key.Node publishes key (a chunk, an IPv6 slice, a split port), with one endpoint on
// node.
func keyedSlice(ns string, key slicemeta.SliceKey) *discoveryv1.EndpointSlice {
	s := ourSlice(ns, key.Resource, key.Node, key.Node)
	s.Name = key.Name()
	if key.AddressType == discoveryv1.AddressTypeIPv6 {
		s.AddressType = discoveryv1.AddressTypeIPv6
		s.Endpoints[0].Addresses = []string{"fd00::1"}
	}
	if key.SplitPort != 0 {
		s.Ports[0].Port = ptr.To(key.SplitPort)
	}
	return s
}

// TestSquatNamesOfOtherNodesAreRefusedAtAdmission runs as node-a's agent (a token bound to an
// agent pod on node-a) under the chart's policies: a slice of node-a under a name of node-b's
// slices (common, single unnamed port, chunk, IPv6, split port, a number other than its port's)
// or under a digest where node-a's name fits is refused, with a message that names the name it
// may take; the agent of a long node may create only digest names where its name does not fit
// (which digest, CEL cannot tell: the controller deletes the wrong one, see
// images/controller TestSquatSlicesAreDeletedWithAnEventAndTheHonestOnesKept). Positive
// control: the honest agents' own slices (common, single port, chunks, IPv6, split port, IPv6
// chunk of a split port, a long node's digest and its chunk) are admitted.
func TestSquatNamesOfOtherNodesAreRefusedAtAdmission(t *testing.T) {
	enforcePolicies(t)
	tenant := env.CreateNamespaceForTest(t, "squat")
	a := podClient(t, "agent", nodeA)
	long := podClient(t, "agent", longNode)
	otherLong := strings.Replace(longNode, "a", "z", 63)

	key := func(node string, f ...func(*slicemeta.SliceKey)) slicemeta.SliceKey {
		k := slicemeta.SliceKey{Resource: "web", Port: "http", Node: node}
		for _, o := range f {
			o(&k)
		}
		return k
	}
	chunk := func(n int) func(*slicemeta.SliceKey) { return func(k *slicemeta.SliceKey) { k.Chunk = n } }
	v6 := func(k *slicemeta.SliceKey) { k.AddressType = discoveryv1.AddressTypeIPv6 }
	split := func(k *slicemeta.SliceKey) { k.SplitPort = 8081 }
	unnamed := func(k *slicemeta.SliceKey) { k.Port = "" }
	// as is node-a's slice of k under the name of other.
	as := func(k, other slicemeta.SliceKey) *discoveryv1.EndpointSlice {
		s := keyedSlice(tenant, k)
		s.Name = other.Name()
		return s
	}
	createAs := func(c client.Client, s *discoveryv1.EndpointSlice) func(context.Context, client.Client) error {
		return func(ctx context.Context, _ client.Client) error { return c.Create(ctx, s) }
	}
	ownCase := func(c client.Client, k slicemeta.SliceKey) writeCase {
		return writeCase{do: createAs(c, unnamedPort(keyedSlice(tenant, k), k.Port))}
	}

	cases := map[string]writeCase{
		"its common name":                     ownCase(a, key(nodeA)),
		"its single unnamed port":             ownCase(a, key(nodeA, unnamed)),
		"its chunk":                           ownCase(a, key(nodeA, chunk(2))),
		"its IPv6 slice":                      ownCase(a, key(nodeA, v6)),
		"its split port":                      ownCase(a, key(nodeA, split)),
		"its IPv6 chunk of a split port":      ownCase(a, key(nodeA, v6, chunk(12), split)),
		"the long node's digest":              ownCase(long, key(longNode)),
		"the long node's chunk of its digest": ownCase(long, key(longNode, chunk(3))),
		"the long node's IPv6 split port":     ownCase(long, key(longNode, v6, split)),

		"node-b's common name": {refusal: "such as web-http-" + nodeA + ", not web-http-" + nodeB,
			do: createAs(a, as(key(nodeA), key(nodeB)))},
		"node-b's single unnamed port": {refusal: refusedSquat,
			do: createAs(a, unnamedPort(as(key(nodeA, unnamed), key(nodeB, unnamed)), ""))},
		"node-b's chunk": {refusal: "such as web-http---1-" + nodeA + ", not web-http---1-" + nodeB,
			do: createAs(a, as(key(nodeA, chunk(1)), key(nodeB, chunk(1))))},
		"node-b's IPv6 slice": {refusal: refusedSquat,
			do: createAs(a, as(key(nodeA, v6), key(nodeB, v6)))},
		"node-b's split port": {refusal: refusedSquat,
			do: createAs(a, as(key(nodeA, split), key(nodeB, split)))},
		"a split-port number other than its port's": {refusal: refusedSquat,
			do: createAs(a, as(key(nodeA), key(nodeA, func(k *slicemeta.SliceKey) { k.SplitPort = 9999 })))},
		"the IPv4 name for an IPv6 slice": {refusal: refusedSquat,
			do: createAs(a, as(key(nodeA, v6), key(nodeA)))},
		"chunk zero": {refusal: refusedSquat, do: func(ctx context.Context, _ client.Client) error {
			s := keyedSlice(tenant, key(nodeA))
			s.Name = "web-http---0-" + nodeA
			return a.Create(ctx, s)
		}},
		"a digest where its node name fits": {refusal: refusedSquat, do: func(ctx context.Context, _ client.Client) error {
			s := keyedSlice(tenant, key(nodeA))
			s.Name = "web-http-" + wellknown.NodeDigest(nodeA)
			return a.Create(ctx, s)
		}},
		"another node's name for a long node": {refusal: refusedSquat,
			do: createAs(long, as(key(longNode), key(nodeB)))},
		"a digest not of hex digits": {refusal: refusedSquat, do: func(ctx context.Context, _ client.Client) error {
			s := keyedSlice(tenant, key(longNode))
			s.Name = "web-http-" + strings.Repeat("g", 16)
			return long.Create(ctx, s)
		}},
	}
	runWrites(t, a, cases)

	t.Run("another long node's digest passes admission: CEL has no hash, the controller deletes it", func(t *testing.T) {
		s := as(key(longNode), key(otherLong))
		require.False(t, slicemeta.NameIsItsNodes(s))
		assert.NoError(t, long.Create(t.Context(), s, client.DryRunAll))
	})
}

// unnamedPort gives s the port name the key has ("" for a single unnamed port).
func unnamedPort(s *discoveryv1.EndpointSlice, port string) *discoveryv1.EndpointSlice {
	s.Ports[0].Name = ptr.To(port)
	if port == "" {
		s.Labels[wellknown.LabelPort] = ""
	}
	return s
}

// TestExhaustSliceBoundsAreRefusedAtAdmission runs as node-a's agent under the chart's
// policies: a slice that carries more than the agent writes (an annotation of its own, a 200 KiB
// one, a label of its own, a finalizer, another owner, 1,001 endpoints, an endpoint of many
// addresses or with hints, two ports) is refused with a message naming what. Positive control:
// the agent's own slice with its not-ready note and 1000 endpoints is admitted; an annotation
// and a label an administrator added are kept through the agent's update (its Merge keeps
// them), and an update that keeps the endpoints of a slice written before the bounds is
// admitted (ratcheting).
func TestExhaustSliceBoundsAreRefusedAtAdmission(t *testing.T) {
	enforcePolicies(t)
	tenant := env.CreateNamespaceForTest(t, "exhaust")
	a := podClient(t, "agent", nodeA)
	web := func(resource string) *discoveryv1.EndpointSlice { return ourSlice(tenant, resource, nodeA, nodeA) }
	many := func(s *discoveryv1.EndpointSlice, n int) *discoveryv1.EndpointSlice {
		s.Endpoints = nil
		for i := range n {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{fmt.Sprintf("10.2.%d.%d", i/250, i%250+1)},
				NodeName:   ptr.To(nodeA),
				TargetRef:  podRef(tenant, fmt.Sprintf("p-%d", i)),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)},
			})
		}
		return s
	}

	cases := map[string]writeCase{
		"its slice with its not-ready note": {do: func(ctx context.Context, c client.Client) error {
			s := web("noted")
			s.Endpoints[0].Conditions.Ready = ptr.To(false)
			s.Annotations[notready.Annotation] = notready.Encode(map[string]string{s.Endpoints[0].TargetRef.Name: "connection refused"})
			return c.Create(ctx, s)
		}},
		"its slice with the trigger time kube-proxy measures from": {do: func(ctx context.Context, c client.Client) error {
			s := web("triggered")
			s.Annotations[corev1.EndpointsLastChangeTriggerTime] = "2026-12-06T03:09:12.123456789Z"
			if err := c.Create(ctx, s); err != nil {
				return err
			}
			s.Annotations[corev1.EndpointsLastChangeTriggerTime] = "2026-12-06T03:09:13.5Z"
			return c.Update(ctx, s)
		}},
		"its slice of 1000 endpoints": {do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, many(web("full"), 1000))
		}},
		"an update that keeps what an administrator added": {do: func(ctx context.Context, c client.Client) error {
			s := web("kept")
			s.Annotations["team.example.com/owner"] = "team-a"
			s.Labels["team.example.com/tier"] = "gold"
			s.Finalizers = []string{"example.com/hold"}
			created(t, s)
			t.Cleanup(func() {
				var cur discoveryv1.EndpointSlice
				if env.Client.Get(context.Background(), client.ObjectKeyFromObject(s), &cur) == nil {
					cur.Finalizers = nil
					_ = env.Client.Update(context.Background(), &cur)
				}
			})
			s.Endpoints[0].Conditions.Ready = ptr.To(false)
			return c.Update(ctx, s)
		}},
		"an update that keeps the endpoints of a slice written before the bounds": {do: func(ctx context.Context, c client.Client) error {
			s := web("older")
			s.Endpoints[0].Addresses = []string{"10.3.0.1", "10.3.0.2"}
			delete(s.Labels, wellknown.LabelNodeKey)
			created(t, s)
			s.Labels[wellknown.LabelNodeKey] = slicemeta.NodeKey(nodeA)
			return c.Update(ctx, s)
		}},

		"an annotation of its own": {refusal: refusedExtra + " (" + strings.Join(ownLabelKeys, ", ") + ") and annotations (network.deckhouse.io/node, network.deckhouse.io/not-ready-reasons, endpoints.kubernetes.io/last-change-trigger-time)", do: func(ctx context.Context, c client.Client) error {
			s := web("annotated")
			s.Annotations["attacker.example.com/x"] = "y"
			return c.Create(ctx, s)
		}},
		"an annotation of 200 KiB": {refusal: "refused: the annotation attacker.example.com/blob", do: func(ctx context.Context, c client.Client) error {
			s := web("blob")
			s.Annotations["attacker.example.com/blob"] = strings.Repeat("x", 200<<10)
			return c.Create(ctx, s)
		}},
		"an annotation added by its update": {refusal: "refused: the annotation attacker.example.com/x", do: func(ctx context.Context, c client.Client) error {
			s := web("later")
			if err := c.Create(ctx, s); err != nil {
				return err
			}
			s.Annotations["attacker.example.com/x"] = "y"
			return c.Update(ctx, s)
		}},
		"an administrator's annotation changed by its update": {refusal: "refused: the annotation team.example.com/owner", do: func(ctx context.Context, c client.Client) error {
			s := web("changed")
			s.Annotations["team.example.com/owner"] = "team-a"
			created(t, s)
			s.Annotations["team.example.com/owner"] = strings.Repeat("x", 100<<10)
			return c.Update(ctx, s)
		}},
		"a trigger time of 200 characters": {refusal: "last-change-trigger-time annotation of an EndpointSlice the agent writes is a time of at most 64 characters, not 200", do: func(ctx context.Context, c client.Client) error {
			s := web("long-trigger")
			s.Annotations[corev1.EndpointsLastChangeTriggerTime] = strings.Repeat("9", 200)
			return c.Create(ctx, s)
		}},
		"a label of its own": {refusal: "refused: the label attacker.example.com/x", do: func(ctx context.Context, c client.Client) error {
			s := web("labelled")
			s.Labels["attacker.example.com/x"] = "y"
			return c.Create(ctx, s)
		}},
		"a finalizer": {refusal: "refused: the finalizer example.com/never", do: func(ctx context.Context, c client.Client) error {
			s := web("final")
			s.Finalizers = []string{"example.com/never"}
			return c.Create(ctx, s)
		}},
		"another owner": {refusal: "refused: the owner reference to ConfigMap cm", do: func(ctx context.Context, c client.Client) error {
			s := web("owned")
			s.OwnerReferences = append(s.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "cm", UID: "uid-of-cm"})
			return c.Create(ctx, s)
		}},
		"a second owner reference of its resource": {refusal: "refused: a second ServiceWithHealthchecks owner reference", do: func(ctx context.Context, c client.Client) error {
			s := web("twice")
			ref := s.OwnerReferences[0]
			ref.UID = "uid-of-another-twice"
			ref.Controller, ref.BlockOwnerDeletion = nil, nil
			s.OwnerReferences = append(s.OwnerReferences, ref)
			return c.Create(ctx, s)
		}},
		"two ports": {refusal: "and at most one port; refused: 2 ports", do: func(ctx context.Context, c client.Client) error {
			s := web("ports")
			s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: ptr.To("other"), Port: ptr.To[int32](9090), Protocol: ptr.To(corev1.ProtocolTCP)})
			return c.Create(ctx, s)
		}},
		"an endpoint of many addresses": {refusal: "refused: an endpoint with 3 addresses", do: func(ctx context.Context, c client.Client) error {
			s := web("addresses")
			s.Endpoints[0].Addresses = []string{"10.4.0.1", "10.4.0.2", "10.4.0.3"}
			return c.Create(ctx, s)
		}},
		"an endpoint with hints": {refusal: "refused: an endpoint with hints", do: func(ctx context.Context, c client.Client) error {
			s := web("hinted")
			s.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}}
			return c.Create(ctx, s)
		}},
	}
	runWrites(t, a, cases)

	t.Run("1001 endpoints are refused (by the API server's own validation, before the policy)", func(t *testing.T) {
		err := a.Create(t.Context(), many(web("over"), 1001))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "1000")
	})
}

// ownLabelKeys are the label keys the agent writes (api/slicemeta Labels), as the policy's
// message lists them.
var ownLabelKeys = []string{
	discoveryv1.LabelServiceName, discoveryv1.LabelManagedBy, wellknown.LabelResource, wellknown.LabelPort,
	wellknown.LabelNodeKey, wellknown.LabelNode,
}
