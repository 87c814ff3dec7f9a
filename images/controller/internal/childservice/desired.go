// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package childservice decides what the child Service of a ServiceWithHealthchecks must look
// like and whether the controller may touch an existing Service of that name. Everything here
// is a pure function of plain values; the reconciler holds the client.
package childservice

import (
	"cmp"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// FieldManager is the field manager the controller writes child Services with. Both replicas use
// the same one, so a leadership hand-over changes no field ownership.
const FieldManager = "service-with-healthchecks-controller"

// defaultSessionAffinityTimeout is what the API server fills in for ClientIP affinity (3 hours).
const defaultSessionAffinityTimeout int32 = 10800

// notPropagated lists annotations of the resource that describe the resource itself and are not
// copied to the Service.
var notPropagated = map[string]bool{
	corev1.LastAppliedConfigAnnotation: true,
}

// Desired returns the child Service the resource asks for, as a server-side apply configuration.
//
// owned is what this controller's field manager owns in the existing Service (see
// corev1ac.ExtractService), or nil when the Service does not exist yet. It matters for one thing
// only: the cluster IPs are requested when the Service is created and never changed afterwards
// (they are immutable), so for an existing Service the desired cluster IPs are whatever the
// controller already owns there.
//
// Fields the API server would default are set explicitly to that default. The controller then
// owns a value for every field it manages, and the configuration it applied equals the one it
// reads back from managedFields, so a steady state needs no write.
//
// The selector is never set: an empty selector keeps the built-in endpoint controller away.
func Desired(swh *v1alpha1.ServiceWithHealthchecks, owned *corev1ac.ServiceApplyConfiguration) *corev1ac.ServiceApplyConfiguration {
	s := &swh.Spec
	typ := cmp.Or(s.Type, corev1.ServiceTypeClusterIP)
	needsNodePorts := typ == corev1.ServiceTypeNodePort || typ == corev1.ServiceTypeLoadBalancer

	spec := corev1ac.ServiceSpec().WithType(typ)
	for i := range s.Ports {
		spec.WithPorts(desiredPort(&s.Ports[i], needsNodePorts))
	}
	desiredClusterIPs(spec, s, owned)
	if len(s.ExternalIPs) > 0 {
		spec.WithExternalIPs(s.ExternalIPs...)
	}
	desiredSessionAffinity(spec, s)
	desiredTrafficPolicies(spec, s, needsNodePorts)
	if s.PublishNotReadyAddresses {
		spec.WithPublishNotReadyAddresses(true)
	}
	if len(s.IPFamilies) > 0 {
		spec.WithIPFamilies(s.IPFamilies...)
	}
	if s.IPFamilyPolicy != nil {
		spec.WithIPFamilyPolicy(*s.IPFamilyPolicy)
	}
	if typ == corev1.ServiceTypeLoadBalancer {
		desiredLoadBalancer(spec, s)
	}
	if s.TrafficDistribution != nil && *s.TrafficDistribution != "" {
		spec.WithTrafficDistribution(*s.TrafficDistribution)
	}
	return desiredService(swh, spec)
}

// desiredClusterIPs sets the cluster IPs: the resource's at creation (owned is nil), the ones
// the controller already owns afterwards (cluster IPs are set only at creation).
func desiredClusterIPs(spec *corev1ac.ServiceSpecApplyConfiguration, s *v1alpha1.ServiceWithHealthchecksSpec, owned *corev1ac.ServiceApplyConfiguration) {
	if owned == nil {
		if s.ClusterIP != "" {
			spec.WithClusterIP(s.ClusterIP)
		}
		if len(s.ClusterIPs) > 0 {
			spec.WithClusterIPs(s.ClusterIPs...)
		}
	} else if owned.Spec != nil {
		spec.ClusterIP = owned.Spec.ClusterIP
		spec.ClusterIPs = slices.Clone(owned.Spec.ClusterIPs)
	}
}

// desiredSessionAffinity sets the session affinity, with the API server's default timeout for
// ClientIP when the resource names none.
func desiredSessionAffinity(spec *corev1ac.ServiceSpecApplyConfiguration, s *v1alpha1.ServiceWithHealthchecksSpec) {
	affinity := cmp.Or(s.SessionAffinity, corev1.ServiceAffinityNone)
	spec.WithSessionAffinity(affinity)
	if affinity == corev1.ServiceAffinityClientIP {
		timeout := defaultSessionAffinityTimeout
		if c := s.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			timeout = *c.ClientIP.TimeoutSeconds
		}
		spec.WithSessionAffinityConfig(corev1ac.SessionAffinityConfig().
			WithClientIP(corev1ac.ClientIPConfig().WithTimeoutSeconds(timeout)))
	}
}

// desiredTrafficPolicies sets the external (for node ports) and internal traffic policies and
// the health check node port, with the API server's defaults.
func desiredTrafficPolicies(spec *corev1ac.ServiceSpecApplyConfiguration, s *v1alpha1.ServiceWithHealthchecksSpec, needsNodePorts bool) {
	if needsNodePorts {
		spec.WithExternalTrafficPolicy(cmp.Or(s.ExternalTrafficPolicy, corev1.ServiceExternalTrafficPolicyCluster))
	}
	internal := corev1.ServiceInternalTrafficPolicyCluster
	if s.InternalTrafficPolicy != nil && *s.InternalTrafficPolicy != "" {
		internal = *s.InternalTrafficPolicy
	}
	spec.WithInternalTrafficPolicy(internal)
	if s.HealthCheckNodePort != 0 {
		spec.WithHealthCheckNodePort(s.HealthCheckNodePort)
	}
}

// desiredLoadBalancer sets the fields of a LoadBalancer Service.
func desiredLoadBalancer(spec *corev1ac.ServiceSpecApplyConfiguration, s *v1alpha1.ServiceWithHealthchecksSpec) {
	allocate := true
	if s.AllocateLoadBalancerNodePorts != nil {
		allocate = *s.AllocateLoadBalancerNodePorts
	}
	spec.WithAllocateLoadBalancerNodePorts(allocate)
	if s.LoadBalancerIP != "" {
		spec.WithLoadBalancerIP(s.LoadBalancerIP)
	}
	if len(s.LoadBalancerSourceRanges) > 0 {
		spec.WithLoadBalancerSourceRanges(s.LoadBalancerSourceRanges...)
	}
	if s.LoadBalancerClass != nil {
		spec.WithLoadBalancerClass(*s.LoadBalancerClass)
	}
}

// desiredService is the Service of swh with spec: the resource as controlling owner, its labels
// and the annotations that propagate.
func desiredService(swh *v1alpha1.ServiceWithHealthchecks, spec *corev1ac.ServiceSpecApplyConfiguration) *corev1ac.ServiceApplyConfiguration {
	ref := slicemeta.OwnerReference(swh.Name, swh.UID)
	svc := corev1ac.Service(swh.Name, swh.Namespace).
		WithOwnerReferences(metav1ac.OwnerReference().
			WithAPIVersion(ref.APIVersion).
			WithKind(ref.Kind).
			WithName(ref.Name).
			WithUID(ref.UID).
			WithController(*ref.Controller).
			WithBlockOwnerDeletion(*ref.BlockOwnerDeletion)).
		WithSpec(spec)
	if len(swh.Labels) > 0 {
		svc.WithLabels(swh.Labels)
	}
	for k, v := range swh.Annotations {
		if !notPropagated[k] {
			svc.WithAnnotations(map[string]string{k: v})
		}
	}
	return svc
}

func desiredPort(p *v1alpha1.ServicePort, needsNodePorts bool) *corev1ac.ServicePortApplyConfiguration {
	out := corev1ac.ServicePort().
		WithProtocol(cmp.Or(p.Protocol, corev1.ProtocolTCP)).
		WithPort(p.Port)
	if p.Name != "" {
		out.WithName(p.Name)
	}
	// An appProtocol admitted before it had to be a qualified name would make every write of
	// the Service fail: it is left out (the status reports it: SpecOutOfBounds).
	if p.AppProtocol != nil && len(validation.IsQualifiedName(*p.AppProtocol)) == 0 {
		out.WithAppProtocol(*p.AppProtocol)
	}
	out.WithTargetPort(p.EffectiveTargetPort())
	if needsNodePorts && p.NodePort != 0 {
		out.WithNodePort(p.NodePort)
	}
	return out
}

// Changed tells whether applying desired would change anything the controller owns, given owned,
// the configuration it owns now (corev1ac.ExtractService of the live Service). The order of ports
// and owner references does not matter.
func Changed(desired, owned *corev1ac.ServiceApplyConfiguration) bool {
	if owned == nil {
		return true
	}
	return !equality.Semantic.DeepEqual(normalize(desired), normalize(owned))
}

func normalize(in *corev1ac.ServiceApplyConfiguration) *corev1ac.ServiceApplyConfiguration {
	out := *in
	out.Status = nil
	if in.ObjectMetaApplyConfiguration != nil {
		objectMeta := *in.ObjectMetaApplyConfiguration
		// Identity and bookkeeping fields are preconditions of a write, never owned content.
		objectMeta.UID, objectMeta.ResourceVersion, objectMeta.Generation, objectMeta.CreationTimestamp = nil, nil, nil, nil
		if len(objectMeta.Labels) == 0 {
			objectMeta.Labels = nil
		}
		if len(objectMeta.Annotations) == 0 {
			objectMeta.Annotations = nil
		}
		objectMeta.OwnerReferences = slices.Clone(objectMeta.OwnerReferences)
		slices.SortFunc(objectMeta.OwnerReferences, func(a, b metav1ac.OwnerReferenceApplyConfiguration) int {
			return cmp.Compare(deref(a.UID), deref(b.UID))
		})
		out.ObjectMetaApplyConfiguration = &objectMeta
	}
	if in.Spec != nil {
		spec := *in.Spec
		spec.Ports = slices.Clone(spec.Ports)
		slices.SortFunc(spec.Ports, func(a, b corev1ac.ServicePortApplyConfiguration) int {
			return cmp.Or(cmp.Compare(deref(a.Port), deref(b.Port)), cmp.Compare(deref(a.Protocol), deref(b.Protocol)))
		})
		if len(spec.Ports) == 0 {
			spec.Ports = nil
		}
		out.Spec = &spec
	}
	return &out
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// Ownership says what the controller may do with an existing Service of the resource's name.
type Ownership int

// The kinds of ownership.
const (
	// Absent: no Service of that name exists; the controller creates it.
	Absent Ownership = iota
	// Owned: the Service names the live resource as its owner.
	Owned
	// Adoptable: the Service belongs to nobody, carries the adopt annotation and may be adopted.
	Adoptable
	// Stale: the Service is controlled by a deleted resource of the same name. It is garbage,
	// deleted like the garbage collector would, and then created anew.
	Stale
	// Foreign: the Service belongs to someone else and is never modified.
	Foreign
)

// String names the ownership for logs.
func (o Ownership) String() string {
	switch o {
	case Absent:
		return "Absent"
	case Owned:
		return "Owned"
	case Adoptable:
		return "Adoptable"
	case Stale:
		return "Stale"
	case Foreign:
		return "Foreign"
	}
	return "Ownership(" + strconv.Itoa(int(o)) + ")"
}

// Classify tells who owns live (nil when no Service of the name exists) from the point of view
// of the live resource swh.
func Classify(swh *v1alpha1.ServiceWithHealthchecks, live *corev1.Service) Ownership {
	if live == nil {
		return Absent
	}
	for _, ref := range live.OwnerReferences {
		if slicemeta.IsResourceRef(ref) && ref.UID == swh.UID {
			return Owned
		}
	}
	for _, ref := range live.OwnerReferences {
		if ref.Controller == nil || !*ref.Controller {
			continue
		}
		if slicemeta.IsResourceRef(ref) && ref.Name == swh.Name {
			return Stale
		}
		// Another controller: adding ours would make two, which the API server refuses.
		return Foreign
	}
	if live.Annotations[wellknown.AnnotationAdopt] == "true" {
		return Adoptable
	}
	return Foreign
}

// ControlledByResource tells whether a Service is controlled by a ServiceWithHealthchecks named
// name (of any UID). The controller deletes such a Service once that resource is gone.
func ControlledByResource(svc *corev1.Service, name string) bool {
	for _, ref := range svc.OwnerReferences {
		if ref.Controller != nil && *ref.Controller && slicemeta.IsResourceRef(ref) && ref.Name == name {
			return true
		}
	}
	return false
}
