// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Defaults the API server applies (kept here so both programs and the tests agree).
const (
	DefaultInitialDelaySeconds int32 = 10
	DefaultPeriodSeconds       int32 = 10
	DefaultTimeoutSeconds      int32 = 1
	DefaultSuccessThreshold    int32 = 1
	DefaultFailureThreshold    int32 = 3
	DefaultPostgreSQLQuery           = "SELECT 1"
	DefaultPostgreSQLDBName          = "postgres"
	DefaultMySQLQuery                = "SELECT 1"
)

// Input bounds the CRD enforces at admission (the kubebuilder markers below repeat the numbers:
// markers cannot name constants; testkit/crd checks each one is the exact edge of what the API
// server admits). A resource admitted before a bound existed keeps it on updates that leave the
// field unchanged (CRD validation ratcheting); the controller reports it in the SpecOutOfBounds
// condition. development/API.md says why each bound is what it is.
const (
	// MaxCACertLength bounds http.caCert, in characters: about ten PEM certificates, so that
	// 32 probes with their largest values still fit in one object of etcd.
	MaxCACertLength = 16384
	// MaxHTTPHeadersLength bounds the names and values of one probe's httpHeaders together, in
	// characters: servers commonly refuse request headers larger than 8 KiB.
	MaxHTTPHeadersLength = 8192
	// MaxDecisionSeconds bounds the time a probe takes to change its verdict:
	// healthcheck.periodSeconds × max(successThreshold, failureThreshold).
	MaxDecisionSeconds = 3600
)

// ServiceWithHealthchecks is a Service whose endpoints are decided by active probes, per port,
// instead of by the pod's single readiness state.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=swh,categories=all
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.type`
// +kubebuilder:printcolumn:name="Cluster-IP",type=string,JSONPath=`.status.clusterIP`,priority=1
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.readySummary`,description="Ready endpoints per port"
// +kubebuilder:printcolumn:name="External-IP",type=string,JSONPath=`.status.loadBalancer.ingress[*].ip`
// +kubebuilder:printcolumn:name="Ports",type=string,JSONPath=`.spec.ports[*].port`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 63",message="metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter, at most 63 characters) because it names the Service"
type ServiceWithHealthchecks struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the Service to create plus the healthcheck that decides its endpoints.
	// +required
	Spec ServiceWithHealthchecksSpec `json:"spec"`

	// Status is written by the controller alone.
	// +optional
	Status ServiceWithHealthchecksStatus `json:"status,omitempty"`
}

// ServiceWithHealthchecksList is a list of ServiceWithHealthchecks.
//
// +kubebuilder:object:root=true
type ServiceWithHealthchecksList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ServiceWithHealthchecks `json:"items"`
}

// ServiceWithHealthchecksSpec repeats the fields of a Service spec (same names, same meaning)
// and adds the healthcheck section.
//
// +kubebuilder:validation:XValidation:rule="(has(self.ports) && size(self.ports) > 0) || (has(self.clusterIP) && self.clusterIP == 'None')",message="spec.ports must list at least one port (only a headless resource, clusterIP: None, may have none)"
// +kubebuilder:validation:XValidation:rule="!has(self.clusterIP) || self.clusterIP != 'None' || self.type == 'ClusterIP'",message="clusterIP: None (headless) is only valid with type: ClusterIP"
// +kubebuilder:validation:XValidation:rule="!has(self.externalTrafficPolicy) || self.type == 'NodePort' || self.type == 'LoadBalancer'",message="externalTrafficPolicy may only be set for type NodePort or LoadBalancer"
// +kubebuilder:validation:XValidation:rule="!has(self.healthCheckNodePort) || self.healthCheckNodePort == 0 || (self.type == 'LoadBalancer' && has(self.externalTrafficPolicy) && self.externalTrafficPolicy == 'Local')",message="healthCheckNodePort may only be set for type LoadBalancer with externalTrafficPolicy: Local"
// +kubebuilder:validation:XValidation:rule="self.type == 'LoadBalancer' || (!has(self.loadBalancerIP) && !has(self.loadBalancerSourceRanges) && !has(self.loadBalancerClass) && !has(self.allocateLoadBalancerNodePorts))",message="loadBalancerIP, loadBalancerSourceRanges, loadBalancerClass and allocateLoadBalancerNodePorts may only be set for type LoadBalancer"
// +kubebuilder:validation:XValidation:rule="!has(self.ports) || self.type == 'NodePort' || self.type == 'LoadBalancer' || self.ports.all(p, !has(p.nodePort) || p.nodePort == 0)",message="ports[].nodePort may only be set for type NodePort or LoadBalancer"
// +kubebuilder:validation:XValidation:rule="!has(self.sessionAffinityConfig) || self.sessionAffinity == 'ClientIP'",message="sessionAffinityConfig may only be set with sessionAffinity: ClientIP"
// +kubebuilder:validation:XValidation:rule="!has(self.healthcheck) || !has(self.healthcheck.probes) || self.healthcheck.probes.all(p, p.timeoutSeconds <= self.healthcheck.periodSeconds)",message="healthcheck.probes[].timeoutSeconds must not exceed healthcheck.periodSeconds: a probe may not still run when the next one is due"
type ServiceWithHealthchecksSpec struct {
	// Ports the Service exposes. Each port needs a name when there is more than one.
	// +optional
	// +listType=map
	// +listMapKey=port
	// +listMapKey=protocol
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="size(self) <= 1 || self.all(p, has(p.name) && p.name != '')",message="every port needs a name when the resource exposes more than one port"
	// +kubebuilder:validation:XValidation:rule="self.all(p, !has(p.name) || self.filter(q, has(q.name) && q.name == p.name).size() == 1)",message="port names must be unique"
	Ports []ServicePort `json:"ports,omitempty"`

	// Selector chooses the pods, in the resource's own namespace, that back the Service.
	// An empty selector selects no pod.
	// +optional
	// +mapType=atomic
	Selector map[string]string `json:"selector,omitempty"`

	// ClusterIP requests a specific address for the child Service ("None" for headless).
	// It is used when the Service is created; it cannot change afterwards.
	// +optional
	ClusterIP string `json:"clusterIP,omitempty"`

	// ClusterIPs requests the addresses of a dual-stack child Service.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=2
	ClusterIPs []string `json:"clusterIPs,omitempty"`

	// Type of the child Service: ClusterIP (default), NodePort or LoadBalancer.
	// ExternalName is not supported: it has no endpoints to check.
	// +optional
	// +kubebuilder:default=ClusterIP
	// +kubebuilder:validation:XValidation:rule="self != 'ExternalName'",message="type ExternalName is not supported: an ExternalName Service has no endpoints to check; use a plain Service instead"
	// +kubebuilder:validation:XValidation:rule="self == 'ExternalName' || self in ['ClusterIP', 'NodePort', 'LoadBalancer']",message="type must be ClusterIP, NodePort or LoadBalancer"
	Type corev1.ServiceType `json:"type,omitempty"`

	// ExternalIPs the cluster also accepts traffic for.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	ExternalIPs []string `json:"externalIPs,omitempty"`

	// SessionAffinity: None (default) or ClientIP.
	// +optional
	// +kubebuilder:default=None
	// +kubebuilder:validation:Enum=None;ClientIP
	SessionAffinity corev1.ServiceAffinity `json:"sessionAffinity,omitempty"`

	// LoadBalancerIP is passed to the child Service (deprecated upstream, kept for compatibility).
	// +optional
	LoadBalancerIP string `json:"loadBalancerIP,omitempty"`

	// LoadBalancerSourceRanges restricts the clients of a LoadBalancer.
	// +optional
	// +listType=atomic
	LoadBalancerSourceRanges []string `json:"loadBalancerSourceRanges,omitempty"`

	// ExternalTrafficPolicy: Cluster or Local, for NodePort and LoadBalancer.
	// +optional
	// +kubebuilder:validation:Enum=Cluster;Local
	ExternalTrafficPolicy corev1.ServiceExternalTrafficPolicy `json:"externalTrafficPolicy,omitempty"`

	// HealthCheckNodePort for type LoadBalancer with externalTrafficPolicy Local.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	HealthCheckNodePort int32 `json:"healthCheckNodePort,omitempty"`

	// PublishNotReadyAddresses publishes every pod with an IP as ready, ignoring the probes.
	// +optional
	PublishNotReadyAddresses bool `json:"publishNotReadyAddresses,omitempty"`

	// SessionAffinityConfig configures ClientIP affinity.
	// +optional
	SessionAffinityConfig *corev1.SessionAffinityConfig `json:"sessionAffinityConfig,omitempty"`

	// IPFamilies of the child Service.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:Enum=IPv4;IPv6
	IPFamilies []corev1.IPFamily `json:"ipFamilies,omitempty"`

	// IPFamilyPolicy of the child Service: SingleStack, PreferDualStack or RequireDualStack.
	// +optional
	// +kubebuilder:validation:Enum=SingleStack;PreferDualStack;RequireDualStack
	IPFamilyPolicy *corev1.IPFamilyPolicy `json:"ipFamilyPolicy,omitempty"`

	// AllocateLoadBalancerNodePorts for type LoadBalancer.
	// +optional
	AllocateLoadBalancerNodePorts *bool `json:"allocateLoadBalancerNodePorts,omitempty"`

	// LoadBalancerClass selects the load-balancer implementation.
	// +optional
	LoadBalancerClass *string `json:"loadBalancerClass,omitempty"`

	// InternalTrafficPolicy: Cluster or Local.
	// +optional
	// +kubebuilder:validation:Enum=Cluster;Local
	InternalTrafficPolicy *corev1.ServiceInternalTrafficPolicy `json:"internalTrafficPolicy,omitempty"`

	// TrafficDistribution is passed to the child Service (for example PreferClose).
	// +optional
	// +kubebuilder:validation:MaxLength=63
	TrafficDistribution *string `json:"trafficDistribution,omitempty"`

	// Healthcheck decides, per port, which pods receive traffic. Without probes every port
	// follows the pod's Ready condition, like a plain Service.
	// +optional
	Healthcheck *Healthcheck `json:"healthcheck,omitempty"`
}

// ServicePort is a port of the child Service (the fields of a Service port).
type ServicePort struct {
	// Name of the port: a DNS-1123 label. Required when there is more than one port.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="port name must consist of lowercase letters, digits and '-', and start and end with a letter or digit"
	Name string `json:"name,omitempty"`

	// Protocol: TCP (default), UDP or SCTP.
	// +kubebuilder:default=TCP
	// +kubebuilder:validation:Enum=TCP;UDP;SCTP
	Protocol corev1.Protocol `json:"protocol"`

	// AppProtocol is a hint for implementations, as in a Service: a qualified name (an optional
	// DNS subdomain prefix and "/", then a name of at most 63 characters), copied to the Service
	// and the EndpointSlices, whose API rejects anything else.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$') && self.indexOf('/') <= 253",message="appProtocol must be a qualified name, as in a Service: an optional DNS subdomain prefix of at most 253 characters and '/', then a name of at most 63 letters, digits, '-', '_' or '.' that starts and ends with a letter or digit (for example http, kubernetes.io/h2c or example.com/custom)"
	AppProtocol *string `json:"appProtocol,omitempty"`

	// Port the Service exposes.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`

	// TargetPort on the pod: a number, or the name of a container port. Omitted (or 0, which
	// is what Go clients send for an unset value) means the same as port.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? (self >= 0 && self <= 65535) : (size(self) <= 15 && self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && self.matches('[a-z]') && !self.contains('--'))",message="targetPort must be a port number from 1 to 65535 or a container port name (lowercase letters, digits and '-', at most 15 characters, with at least one letter)"
	TargetPort intstr.IntOrString `json:"targetPort,omitempty"`

	// NodePort for type NodePort or LoadBalancer; allocated when omitted.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	NodePort int32 `json:"nodePort,omitempty"`
}

// ServiceWithHealthchecksStatus is computed by the controller from the child Service, the
// EndpointSlices and the agents' Leases.
type ServiceWithHealthchecksStatus struct {
	// ObservedGeneration is the generation the status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: ServiceSynced, EndpointsAvailable, SliceNameConflict, AgentsStale,
	// SpecOutOfBounds and Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Ports holds ready and total endpoint counts per Service port.
	// +optional
	// +listType=atomic
	Ports []PortStatus `json:"ports,omitempty"`

	// ReadySummary is a short text of the ready counts, for kubectl get.
	// +optional
	ReadySummary string `json:"readySummary,omitempty"`

	// ClusterIP of the child Service.
	// +optional
	ClusterIP string `json:"clusterIP,omitempty"`

	// LoadBalancer mirrors the child Service's load-balancer status.
	// +optional
	LoadBalancer corev1.LoadBalancerStatus `json:"loadBalancer,omitempty"`
}

// PortStatus counts the endpoints of one Service port.
type PortStatus struct {
	// Name of the Service port (empty for a single unnamed port).
	// +optional
	Name string `json:"name,omitempty"`
	// Port number of the Service port.
	Port int32 `json:"port"`
	// ReadyEndpoints is the number of endpoints published as ready.
	ReadyEndpoints int32 `json:"readyEndpoints"`
	// TotalEndpoints is the number of endpoints published, ready or not.
	TotalEndpoints int32 `json:"totalEndpoints"`
	// NotReady lists the pods published on this port but out of its traffic (not ready:
	// failing probes, drained, terminating or withdrawn), the first ten by pod name, each with
	// the reason the agent gave. It changes only when the set of pods out
	// changes, never at steady state (docs/CR.md, "Which pods are out, and why").
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10
	NotReady []NotReadyPod `json:"notReady,omitempty"`
	// NotReadyOmitted counts the pods out of this port that NotReady does not list:
	// len(notReady) + notReadyOmitted = totalEndpoints - readyEndpoints.
	// +optional
	NotReadyOmitted int32 `json:"notReadyOmitted,omitempty"`
}

// NotReadyPod is a pod out of a port's traffic and why.
type NotReadyPod struct {
	// Pod is the name of the pod (in the resource's namespace).
	// +kubebuilder:validation:MaxLength=253
	Pod string `json:"pod"`
	// Node the pod runs on, as its endpoint names it.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node,omitempty"`
	// Reason is why the pod is out, in the words of the agent's PortNotReady Event ("probe 0
	// (HTTP): HTTP 503") when the pod's slice was last written (a pod of it went out or came
	// back), not updated while the verdict stays; "drained by annotation
	// network.deckhouse.io/drain" for a drained pod, or the controller's reason for endpoints it
	// withdrew. At most 256 characters.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Reason string `json:"reason,omitempty"`
}

// Bounds of the not-ready list of the status.
const (
	// MaxNotReadyPerPort is how many pods status.ports[].notReady lists per port.
	MaxNotReadyPerPort = 10
	// MaxNotReadyListed is how many pods the notReady lists of all ports list together (the
	// ports in spec order fill it), so that a resource with many ports keeps a small status.
	MaxNotReadyListed = 100
	// MaxNotReadyReason is the longest reason, in bytes (so at most that many characters).
	MaxNotReadyReason = 256
)

// Condition types and reasons.
const (
	ConditionServiceSynced      = "ServiceSynced"
	ConditionEndpointsAvailable = "EndpointsAvailable"
	ConditionSliceNameConflict  = "SliceNameConflict"
	ConditionReady              = "Ready"
	// ConditionAgentsStale is True while an agent publishing endpoints of the resource looks
	// stale to the controller: its endpoints are withdrawn, or kept while the liveness guard
	// holds (more than half of the agents stale at once). It does not affect Ready.
	ConditionAgentsStale = "AgentsStale"
	// ConditionSpecOutOfBounds is True while the spec holds values the admission rules refuse
	// today but admitted when the resource was written (CRD validation ratcheting keeps them on
	// updates that leave them unchanged); the message names each field and its bound. It does
	// not affect Ready.
	ConditionSpecOutOfBounds = "SpecOutOfBounds"
	// ConditionProbeBudgetExceeded is True while the resource has targets on a node beyond
	// that node agent's probe budget (its share of --max-probe-targets): those are not probed
	// and their ports are published not serving. The message names the nodes with the targets
	// asked for and probed. It does not affect Ready.
	ConditionProbeBudgetExceeded = "ProbeBudgetExceeded"
)
