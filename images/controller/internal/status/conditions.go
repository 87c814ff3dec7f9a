// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package status

import (
	"fmt"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// endpointsAvailable is the EndpointsAvailable condition of the ports, of which missing
// (WithoutReadyIn) have no ready endpoint.
func endpointsAvailable(ports []v1alpha1.PortStatus, missing []string) metav1.Condition {
	if len(ports) == 0 {
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonNoPorts, Message: "the resource exposes no port"}
	}
	if len(missing) > 0 {
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonNoReadyEndpoints,
			Message: "no ready endpoint for port " + strings.Join(missing, ", ")}
	}
	return metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonEndpointsAvailable, Message: "every port has a ready endpoint"}
}

// agentsStale says whether an agent that published endpoints of the resource (one of its
// slices names the agent's node) looks stale, and what the controller does about it.
func agentsStale(a *Agents, sliceList []discoveryv1.EndpointSlice) metav1.Condition {
	mine := map[string]bool{}
	for i := range sliceList {
		if n := slicemeta.NodeOf(&sliceList[i]); n != "" {
			mine[n] = true
		}
	}
	var nodes []string
	for _, n := range a.Stale {
		if mine[n] {
			nodes = append(nodes, n)
		}
	}
	if len(nodes) == 0 {
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonAgentsFresh,
			Message: "no agent publishing endpoints of this resource looks stale"}
	}
	leases := "their Leases " + wellknown.AgentLeasePrefix + "<node>"
	if a.LeaseNamespace != "" {
		leases += " in namespace " + a.LeaseNamespace
	}
	if a.Guarded {
		return metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonWithdrawalHeld, Message: fmt.Sprintf(
			"%d of %d agents look stale at once (more than half), so the controller withdraws nothing: "+
				"the endpoints of this resource on %s stay as their agents last published them and may be out of date. "+
				"So many at once usually means the controller does not see the agents' Lease renewals rather than that they died: "+
				"check the API server (health, load), the controller's connectivity to it and its logs, and %s",
			max(a.LookStale, len(a.Stale)), a.Known, nodeList(nodes), leases)}
	}
	who := "the agent of " + nodeList(nodes) + " has not renewed its Lease"
	if len(nodes) > 1 {
		who = "the agents of " + nodeList(nodes) + " have not renewed their Leases"
	}
	return metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonEndpointsWithdrawn, Message: fmt.Sprintf(
		"%s for longer than the grace: the endpoints of this resource there are withdrawn (ready=false, serving=false) "+
			"until the agent publishes again; check the agent pods on those nodes and %s",
		who, leases)}
}

// nodeList names nodes for a message: "node a", "nodes a, b", at most maxNamedNodes names.
func nodeList(nodes []string) string {
	word := "node "
	if len(nodes) > 1 {
		word = "nodes "
	}
	if len(nodes) <= maxNamedNodes {
		return word + strings.Join(nodes, ", ")
	}
	return fmt.Sprintf("%s%s and %d more", word, strings.Join(nodes[:maxNamedNodes], ", "), len(nodes)-maxNamedNodes)
}
