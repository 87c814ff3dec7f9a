// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package sliceplan computes, as pure functions, the EndpointSlices one agent publishes for one
// resource on its node (DESIGN §4), and the plan that turns the existing slices into them:
// compute.go (Compute, the desired slices), primary.go (which number of a split port publishes
// unsuffixed), diff.go (Diff, the plan) and merge.go (Merge, the desired content on the
// latest version of a slice).
package sliceplan

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
)

// Pod is one selected pod of the node with the per-port rule applied to it.
type Pod struct {
	Pod *corev1.Pod
	// Endpoints has one entry per spec.ports entry (portrule.Evaluate).
	Endpoints []portrule.Endpoint
}

// Input is everything the desired slices of one (resource, node) depend on.
type Input struct {
	Resource *v1alpha1.ServiceWithHealthchecks
	Node     string
	// Zone is the node's topology.kubernetes.io/zone label ("" leaves endpoints without a zone).
	Zone string
	Pods []Pod
	// Existing are the slices this agent published before for (resource, node). An endpoint
	// whose verdict is undecided keeps the conditions it has there (DESIGN §5); one that is in
	// none of them is left out until its verdict is decided (unless the resource publishes
	// not-ready addresses). A split port keeps its primary number.
	Existing []*discoveryv1.EndpointSlice
	// MaxEndpointsPerSlice is how many endpoints one slice of a (port, family, number) holds
	// before the group is split into chunks (assignChunks); 0 is DefaultMaxEndpointsPerSlice.
	MaxEndpointsPerSlice int
}

// Desired is one slice to publish and the key it is published under.
type Desired struct {
	Key   slicemeta.SliceKey
	Slice *discoveryv1.EndpointSlice
	// Changed holds, for each of Slice's endpoints in order, when its verdict was decided
	// (zero when not known): StampTriggers reads it.
	Changed []time.Time
}

// carryKey finds an endpoint of a pod on a port in the existing slices.
type carryKey struct {
	port    string
	podUID  types.UID
	address string
}

// groupKey is one candidate slice before primary numbers are chosen.
type groupKey struct {
	port   int
	family discoveryv1.AddressType
	number int32
}
