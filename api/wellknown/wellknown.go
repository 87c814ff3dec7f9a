// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package wellknown holds the names the module's programs, its chart, its hooks and its users
// agree on: the API group and kind, the module's namespace, the labels and annotations it reads
// and writes, the credential Secret types and the names of the agents' Leases. Like the
// EndpointSlice API's well_known_labels.go, it is constants and the pure functions that make
// names, nothing more; how slices are named and owned is package slicemeta's.
package wellknown

import (
	"crypto/sha256"
	"encoding/hex"
)

// The module's resource.
const (
	// Group is the API group of the module's resource.
	Group = "network.deckhouse.io"
	// Kind is the kind of the module's resource, as owner references name it.
	Kind = "ServiceWithHealthchecks"
)

// Namespace is the module's namespace: where the controller and the agents run, the controller
// holds its leader-election Lease and the agents renew theirs (the programs' defaults; the
// chart renders it).
const Namespace = "d8-service-with-healthchecks"

// Labels and annotations of the EndpointSlices the module publishes.
const (
	// ManagedBy is this module's value of the endpointslice.kubernetes.io/managed-by label.
	ManagedBy = "service-with-healthchecks.network.deckhouse.io"

	// LabelResource holds the name of the ServiceWithHealthchecks a slice belongs to.
	LabelResource = "network.deckhouse.io/service-with-healthchecks"
	// LabelPort holds the name of the Service port a slice publishes ("" for a single unnamed port).
	LabelPort = "network.deckhouse.io/service-port"
	// LabelNode holds the node name where it fits in a label value (63 characters).
	LabelNode = "network.deckhouse.io/node"
	// LabelNodeKey holds the node in a form that always fits a label value (slicemeta.NodeKey):
	// the agents' caches select their own node's slices by it. The node annotation stays the
	// authority on which node a slice is for.
	LabelNodeKey = "network.deckhouse.io/node-key"
	// AnnotationNode always holds the full node name.
	AnnotationNode = "network.deckhouse.io/node"
)

// AnnotationAdopt on a Service lets a ServiceWithHealthchecks of the same name adopt it.
const AnnotationAdopt = "network.deckhouse.io/adopt"

// AnnotationDrain on a Pod takes it out of new connections of the resources it names while
// existing ones continue: "*" for every resource that selects it, or a comma-separated list of
// resource names ("web", every port of it) and resource/port names ("web/http"; a port without
// a name by its number, "web/8080"). Its endpoints are published ready=false, serving as their
// probes decide, not terminating (docs/CR.md, "Draining a pod").
const AnnotationDrain = "network.deckhouse.io/drain"

// DrainAll is the value of AnnotationDrain that drains the pod from every resource.
const DrainAll = "*"

// SecretTypePostgreSQLCredentials is the type of a PostgreSQL credential Secret.
const SecretTypePostgreSQLCredentials = "network.deckhouse.io/postgresql-credentials"

// SecretTypeMySQLCredentials is the type of a MySQL/MariaDB credential Secret. It has the keys
// of a PostgreSQL one (user, password, tlsMode, caCert, clientCert, clientKey).
const SecretTypeMySQLCredentials = "network.deckhouse.io/mysql-credentials"

// IsCredentialSecretType reports whether t is the type of a credential Secret a probe can use.
func IsCredentialSecretType(t string) bool {
	return t == SecretTypePostgreSQLCredentials || t == SecretTypeMySQLCredentials
}

// MaxNameLength is the longest object name (a DNS subdomain).
const MaxNameLength = 253

// digestLength is how many hex characters of the node name's SHA-256 stand for a long name.
const digestLength = 16

// NodeDigest is the short, stable stand-in for a node name too long to fit in an object name.
func NodeDigest(node string) string {
	sum := sha256.Sum256([]byte(node))
	return hex.EncodeToString(sum[:])[:digestLength]
}

// AgentLeasePrefix starts the name of every agent's node Lease in the lease namespace.
const AgentLeasePrefix = "swh-agent-"

// AgentLeaseName is the name of the Lease the agent of a node renews: swh-agent-<node>, or
// swh-agent-<digest> when the node name does not fit in an object name. The Lease's
// holderIdentity and the node annotation always hold the full node name.
func AgentLeaseName(node string) string {
	if len(AgentLeasePrefix)+len(node) <= MaxNameLength {
		return AgentLeasePrefix + node
	}
	return AgentLeasePrefix + NodeDigest(node)
}
