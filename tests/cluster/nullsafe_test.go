// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestPoliciesJudgeObjectsLackingOptionalFields: the agent's and the controller's policies judge
// a slice or Lease whose optional fields are absent or null, never fail evaluating it (a CEL
// error refuses the write too, failurePolicy Fail, but says nothing and refused what must be
// admitted). The API server serializes an EndpointSlice's empty endpoints and ports as null,
// which has() does not catch: the agent could not delete its own node's empty slice, and the
// controller could not change an empty slice. Now: the agent deletes an empty slice of its node;
// it may not write one (an explicit rule: it deletes a slice whose endpoints are all gone); a
// slice without ports or without an endpoint's conditions is judged by the other rules; the
// controller's update of an empty slice is judged; a Lease without a spec is refused by its
// rule.
func TestPoliciesJudgeObjectsLackingOptionalFields(t *testing.T) {
	enforcePolicies(t)
	tenant := env.CreateNamespaceForTest(t, "nullsafe")
	a := podClient(t, "agent", nodeA)
	ctl := podClient(t, "controller", "nb-control-plane")
	web := func(resource string) *discoveryv1.EndpointSlice { return ourSlice(tenant, resource, nodeA, nodeA) }
	const refusedEmpty = "the agent writes no EndpointSlice without endpoints"

	agentCases := map[string]writeCase{
		"the agent deletes its node's empty slice": {do: func(ctx context.Context, c client.Client) error {
			s := web("delempty")
			s.Endpoints = nil
			created(t, s)
			return c.Delete(ctx, s)
		}},
		"a slice without ports": {do: func(ctx context.Context, c client.Client) error {
			s := web("noports")
			s.Ports = nil
			return c.Create(ctx, s)
		}},
		"a port without name or number": {do: func(ctx context.Context, c client.Client) error {
			s := web("bareport")
			s.Ports[0].Name, s.Ports[0].Port = nil, nil
			return c.Create(ctx, s)
		}},
		"an endpoint without conditions or hostname": {do: func(ctx context.Context, c client.Client) error {
			s := web("nocond")
			s.Endpoints[0].Conditions = discoveryv1.EndpointConditions{}
			s.Endpoints[0].Hostname = nil
			return c.Create(ctx, s)
		}},
		"an empty slice created": {refusal: refusedEmpty, do: func(ctx context.Context, c client.Client) error {
			s := web("noeps")
			s.Endpoints = nil
			return c.Create(ctx, s)
		}},
		"a slice emptied by its update": {refusal: refusedEmpty, do: func(ctx context.Context, c client.Client) error {
			s := web("updempty")
			created(t, s)
			s.Endpoints = nil
			return c.Update(ctx, s)
		}},
		"an endpoint without nodeName": {refusal: refusedEndpointNode, do: func(ctx context.Context, c client.Client) error {
			s := web("nonode")
			s.Endpoints[0].NodeName = nil
			return c.Create(ctx, s)
		}},
		"a slice without labels": {refusal: refusedNotManaged, do: func(ctx context.Context, c client.Client) error {
			s := web("nolabels")
			s.Labels = nil
			return c.Create(ctx, s)
		}},
		"a slice without annotations": {refusal: refusedNodeAnnotation, do: func(ctx context.Context, c client.Client) error {
			s := web("noann")
			s.Annotations = nil
			return c.Create(ctx, s)
		}},
		"a Lease without a spec": {refusal: refusedLeaseHolder, do: func(ctx context.Context, c client.Client) error {
			l := agentLease(nodeA)
			l.Spec = coordinationv1.LeaseSpec{}
			return c.Create(ctx, l)
		}},
	}
	runWrites(t, a, agentCases)

	runWrites(t, ctl, map[string]writeCase{
		"the controller changes an empty slice": {do: func(ctx context.Context, c client.Client) error {
			s := web("cempty")
			s.Endpoints = nil
			created(t, s)
			s.Annotations["touch"] = "1"
			return c.Update(ctx, s)
		}},
		"the controller withdraws an endpoint of a slice without ports": {do: func(ctx context.Context, c client.Client) error {
			s := web("cnoports")
			s.Ports = nil
			created(t, s)
			s.Endpoints[0].Conditions.Ready = ptr.To(false)
			return c.Update(ctx, s)
		}},
		"the controller may not give an empty slice endpoints": {refusal: "the controller may change only the endpoints' conditions", do: func(ctx context.Context, c client.Client) error {
			s := web("cfill")
			eps := s.Endpoints
			s.Endpoints = nil
			created(t, s)
			s.Endpoints = eps
			return c.Update(ctx, s)
		}},
	})
}
