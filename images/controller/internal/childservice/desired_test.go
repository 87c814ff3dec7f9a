// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package childservice

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

const testUID = types.UID("0b5e3f4c-uid")

func resource(mutate func(*v1alpha1.ServiceWithHealthchecks)) *v1alpha1.ServiceWithHealthchecks {
	swh := &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "apps", UID: testUID},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Type:  corev1.ServiceTypeClusterIP,
			Ports: []v1alpha1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
			// The selector belongs to the agent; the child Service never gets one.
			Selector: map[string]string{"app": "web"},
		},
	}
	if mutate != nil {
		mutate(swh)
	}
	return swh
}

// expected is the apply configuration of the default resource; mutate adjusts it.
func expected(mutate func(*corev1ac.ServiceApplyConfiguration)) *corev1ac.ServiceApplyConfiguration {
	svc := corev1ac.Service("web", "apps").
		WithOwnerReferences(metav1ac.OwnerReference().
			WithAPIVersion("network.deckhouse.io/v1alpha1").WithKind("ServiceWithHealthchecks").
			WithName("web").WithUID(testUID).WithController(true).WithBlockOwnerDeletion(true)).
		WithSpec(corev1ac.ServiceSpec().
			WithType(corev1.ServiceTypeClusterIP).
			WithPorts(corev1ac.ServicePort().WithName("http").WithProtocol(corev1.ProtocolTCP).WithPort(80).WithTargetPort(intstr.FromInt32(8080))).
			WithSessionAffinity(corev1.ServiceAffinityNone).
			WithInternalTrafficPolicy(corev1.ServiceInternalTrafficPolicyCluster))
	if mutate != nil {
		mutate(svc)
	}
	return svc
}

func TestDesired(t *testing.T) {
	tests := map[string]struct {
		swh   *v1alpha1.ServiceWithHealthchecks
		owned *corev1ac.ServiceApplyConfiguration
		want  *corev1ac.ServiceApplyConfiguration
	}{
		"a plain resource gets a Service with its ports, no selector and an owner reference": {
			swh:  resource(nil),
			want: expected(nil),
		},
		"labels are copied and annotations too, except kubectl's last applied configuration": {
			swh: resource(func(s *v1alpha1.ServiceWithHealthchecks) {
				s.Labels = map[string]string{"team": "db"}
				s.Annotations = map[string]string{"note": "x", corev1.LastAppliedConfigAnnotation: "{}"}
			}),
			want: expected(func(s *corev1ac.ServiceApplyConfiguration) {
				s.WithLabels(map[string]string{"team": "db"}).WithAnnotations(map[string]string{"note": "x"})
			}),
		},
		"defaults the API server would fill in are explicit: protocol, target port, type, affinity": {
			swh: resource(func(s *v1alpha1.ServiceWithHealthchecks) {
				s.Spec.Type = ""
				s.Spec.Ports = []v1alpha1.ServicePort{{Port: 5432}}
			}),
			want: expected(func(s *corev1ac.ServiceApplyConfiguration) {
				s.Spec.Ports = nil
				s.Spec.WithPorts(corev1ac.ServicePort().WithProtocol(corev1.ProtocolTCP).WithPort(5432).WithTargetPort(intstr.FromInt32(5432)))
			}),
		},
		"a named target port and an app protocol are kept": {
			swh: resource(func(s *v1alpha1.ServiceWithHealthchecks) {
				s.Spec.Ports[0].TargetPort = intstr.FromString("web")
				s.Spec.Ports[0].AppProtocol = ptr.To("http")
			}),
			want: expected(func(s *corev1ac.ServiceApplyConfiguration) {
				s.Spec.Ports[0].WithTargetPort(intstr.FromString("web")).WithAppProtocol("http")
			}),
		},
		"an app protocol the Service API refuses, admitted before admission checked it, is left out": {
			swh: resource(func(s *v1alpha1.ServiceWithHealthchecks) {
				s.Spec.Ports[0].AppProtocol = ptr.To("not a/qualified name")
			}),
			want: expected(nil),
		},
		"cluster IPs are requested when the Service is created": {
			swh: resource(func(s *v1alpha1.ServiceWithHealthchecks) {
				s.Spec.ClusterIP = "10.0.0.10"
				s.Spec.ClusterIPs = []string{"10.0.0.10"}
			}),
			want: expected(func(s *corev1ac.ServiceApplyConfiguration) {
				s.Spec.WithClusterIP("10.0.0.10").WithClusterIPs("10.0.0.10")
			}),
		},
		"cluster IPs of an existing Service stay what the controller owns, whatever the spec says": {
			swh: resource(func(s *v1alpha1.ServiceWithHealthchecks) {
				s.Spec.ClusterIP = "10.0.0.99"
			}),
			owned: corev1ac.Service("web", "apps").WithSpec(corev1ac.ServiceSpec().WithClusterIP("10.0.0.10").WithClusterIPs("10.0.0.10")),
			want: expected(func(s *corev1ac.ServiceApplyConfiguration) {
				s.Spec.WithClusterIP("10.0.0.10").WithClusterIPs("10.0.0.10")
			}),
		},
		"an existing Service whose cluster IP the controller never owned gets none": {
			swh: resource(func(s *v1alpha1.ServiceWithHealthchecks) {
				s.Spec.ClusterIP = "10.0.0.99"
			}),
			owned: corev1ac.Service("web", "apps"),
			want:  expected(nil),
		},
		"a headless resource asks for clusterIP None": {
			swh: resource(func(s *v1alpha1.ServiceWithHealthchecks) {
				s.Spec.ClusterIP = corev1.ClusterIPNone
			}),
			want: expected(func(s *corev1ac.ServiceApplyConfiguration) { s.Spec.WithClusterIP(corev1.ClusterIPNone) }),
		},
		"a LoadBalancer carries its fields, node ports and the explicit defaults of its kind": {
			swh: resource(func(s *v1alpha1.ServiceWithHealthchecks) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.LoadBalancerIP = "192.0.2.1"
				s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24"}
				s.Spec.LoadBalancerClass = ptr.To("example.org/lb")
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
			}),
			want: expected(func(s *corev1ac.ServiceApplyConfiguration) {
				s.Spec.WithType(corev1.ServiceTypeLoadBalancer).
					WithExternalTrafficPolicy(corev1.ServiceExternalTrafficPolicyLocal).
					WithHealthCheckNodePort(32000).
					WithAllocateLoadBalancerNodePorts(true).
					WithLoadBalancerIP("192.0.2.1").
					WithLoadBalancerSourceRanges("192.0.2.0/24").
					WithLoadBalancerClass("example.org/lb")
				s.Spec.Ports[0].WithNodePort(30080)
			}),
		},
		"a NodePort gets externalTrafficPolicy Cluster by default and no load-balancer fields": {
			swh: resource(func(s *v1alpha1.ServiceWithHealthchecks) {
				s.Spec.Type = corev1.ServiceTypeNodePort
				s.Spec.LoadBalancerIP = "192.0.2.1" // rejected by the CRD for NodePort; ignored here all the same
			}),
			want: expected(func(s *corev1ac.ServiceApplyConfiguration) {
				s.Spec.WithType(corev1.ServiceTypeNodePort).WithExternalTrafficPolicy(corev1.ServiceExternalTrafficPolicyCluster)
			}),
		},
		"a ClusterIP Service never carries node ports": {
			swh: resource(func(s *v1alpha1.ServiceWithHealthchecks) {
				s.Spec.Ports[0].NodePort = 30080
			}),
			want: expected(nil),
		},
		"ClientIP affinity gets the default timeout when none is given": {
			swh: resource(func(s *v1alpha1.ServiceWithHealthchecks) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{}}
			}),
			want: expected(func(s *corev1ac.ServiceApplyConfiguration) {
				s.Spec.WithSessionAffinity(corev1.ServiceAffinityClientIP).
					WithSessionAffinityConfig(corev1ac.SessionAffinityConfig().WithClientIP(corev1ac.ClientIPConfig().WithTimeoutSeconds(10800)))
			}),
		},
		"ClientIP affinity keeps a given timeout": {
			swh: resource(func(s *v1alpha1.ServiceWithHealthchecks) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
			}),
			want: expected(func(s *corev1ac.ServiceApplyConfiguration) {
				s.Spec.WithSessionAffinity(corev1.ServiceAffinityClientIP).
					WithSessionAffinityConfig(corev1ac.SessionAffinityConfig().WithClientIP(corev1ac.ClientIPConfig().WithTimeoutSeconds(60)))
			}),
		},
		"external IPs, traffic policies, IP families, publishNotReadyAddresses and trafficDistribution are passed on": {
			swh: resource(func(s *v1alpha1.ServiceWithHealthchecks) {
				s.Spec.ExternalIPs = []string{"198.51.100.7"}
				s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
				s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
				s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack)
				s.Spec.PublishNotReadyAddresses = true
				s.Spec.TrafficDistribution = ptr.To("PreferClose")
			}),
			want: expected(func(s *corev1ac.ServiceApplyConfiguration) {
				s.Spec.WithExternalIPs("198.51.100.7").
					WithInternalTrafficPolicy(corev1.ServiceInternalTrafficPolicyLocal).
					WithIPFamilies(corev1.IPv4Protocol, corev1.IPv6Protocol).
					WithIPFamilyPolicy(corev1.IPFamilyPolicyPreferDualStack).
					WithPublishNotReadyAddresses(true).
					WithTrafficDistribution("PreferClose")
			}),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := Desired(tc.swh, tc.owned)
			assert.Equal(t, tc.want, got)
			assert.Nil(t, got.Spec.Selector, "the child Service never has a selector")
			assert.False(t, Changed(got, got), "a configuration equals itself")
		})
	}
}

func TestChanged(t *testing.T) {
	base := expected(func(s *corev1ac.ServiceApplyConfiguration) {
		s.Spec.WithPorts(corev1ac.ServicePort().WithName("https").WithProtocol(corev1.ProtocolTCP).WithPort(443).WithTargetPort(intstr.FromInt32(8443)))
	})
	tests := map[string]struct {
		owned *corev1ac.ServiceApplyConfiguration
		want  bool
	}{
		"nothing owned yet is a change": {owned: nil, want: true},
		"the same configuration is no change": {owned: expected(func(s *corev1ac.ServiceApplyConfiguration) {
			s.Spec.WithPorts(corev1ac.ServicePort().WithName("https").WithProtocol(corev1.ProtocolTCP).WithPort(443).WithTargetPort(intstr.FromInt32(8443)))
		}), want: false},
		"ports in another order are no change": {owned: expected(func(s *corev1ac.ServiceApplyConfiguration) {
			s.Spec.Ports = append([]corev1ac.ServicePortApplyConfiguration{*corev1ac.ServicePort().WithName("https").WithProtocol(corev1.ProtocolTCP).WithPort(443).WithTargetPort(intstr.FromInt32(8443))}, s.Spec.Ports...)
		}), want: false},
		"a UID and resourceVersion read back from the server are no change": {owned: expected(func(s *corev1ac.ServiceApplyConfiguration) {
			s.WithUID("x").WithResourceVersion("7")
			s.Spec.WithPorts(corev1ac.ServicePort().WithName("https").WithProtocol(corev1.ProtocolTCP).WithPort(443).WithTargetPort(intstr.FromInt32(8443)))
		}), want: false},
		"an owned label that is no longer desired is a change (it must be removed)": {owned: expected(func(s *corev1ac.ServiceApplyConfiguration) {
			s.WithLabels(map[string]string{"gone": "yes"})
			s.Spec.WithPorts(corev1ac.ServicePort().WithName("https").WithProtocol(corev1.ProtocolTCP).WithPort(443).WithTargetPort(intstr.FromInt32(8443)))
		}), want: true},
		"an owned field the resource no longer sets is a change": {owned: expected(func(s *corev1ac.ServiceApplyConfiguration) {
			s.Spec.WithPorts(corev1ac.ServicePort().WithName("https").WithProtocol(corev1.ProtocolTCP).WithPort(443).WithTargetPort(intstr.FromInt32(8443)))
			s.Spec.WithTrafficDistribution("PreferClose")
		}), want: true},
		"a different target port is a change": {owned: expected(func(s *corev1ac.ServiceApplyConfiguration) {
			s.Spec.WithPorts(corev1ac.ServicePort().WithName("https").WithProtocol(corev1.ProtocolTCP).WithPort(443).WithTargetPort(intstr.FromInt32(9443)))
		}), want: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, Changed(base, tc.owned))
		})
	}
}

func TestClassify(t *testing.T) {
	swh := resource(nil)
	ours := slicemeta.OwnerReference("web", testUID)
	stale := slicemeta.OwnerReference("web", "dead-uid")
	otherController := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "x", UID: "u", Controller: ptr.To(true)}
	svc := func(refs []metav1.OwnerReference, annotations map[string]string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "apps", OwnerReferences: refs, Annotations: annotations}}
	}
	adopt := map[string]string{wellknown.AnnotationAdopt: "true"}
	tests := map[string]struct {
		live *corev1.Service
		want Ownership
	}{
		"no Service is absent":                                            {live: nil, want: Absent},
		"a Service owned by the live resource is owned":                   {live: svc([]metav1.OwnerReference{ours}, nil), want: Owned},
		"a Service owned by the live resource stays owned when annotated": {live: svc([]metav1.OwnerReference{ours}, adopt), want: Owned},
		"a Service of nobody is foreign":                                  {live: svc(nil, nil), want: Foreign},
		"a Service of nobody with the adopt annotation is adoptable":      {live: svc(nil, adopt), want: Adoptable},
		"an adopt annotation other than true is foreign":                  {live: svc(nil, map[string]string{wellknown.AnnotationAdopt: "yes"}), want: Foreign},
		"a Service controlled by another controller is foreign even when annotated": {
			live: svc([]metav1.OwnerReference{otherController}, adopt), want: Foreign,
		},
		"a Service controlled by a deleted resource of the same name is stale": {live: svc([]metav1.OwnerReference{stale}, nil), want: Stale},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, Classify(swh, tc.live))
		})
	}
}

func TestDecide(t *testing.T) {
	ours := slicemeta.OwnerReference("web", testUID)
	liveSvc := func(mutate func(*corev1.Service)) *corev1.Service {
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "apps", OwnerReferences: []metav1.OwnerReference{ours}},
			Spec:       corev1.ServiceSpec{ClusterIP: "10.0.0.10"},
		}
		if mutate != nil {
			mutate(s)
		}
		return s
	}
	adoptable := func(s *corev1.Service) {
		s.OwnerReferences = nil
		s.Annotations = map[string]string{wellknown.AnnotationAdopt: "true"}
		s.Spec.Selector = map[string]string{"app": "web"}
	}
	inSync := Desired(resource(nil), corev1ac.Service("web", "apps"))
	tests := map[string]struct {
		in            Input
		wantCreate    bool
		wantApply     bool
		wantAdopt     bool
		wantClear     bool
		wantDelete    bool
		wantStatus    metav1.ConditionStatus
		wantReason    string
		wantInMessage string
	}{
		"no Service: create it": {
			in:         Input{Resource: resource(nil)},
			wantCreate: true, wantStatus: metav1.ConditionTrue, wantReason: ReasonSynced,
		},
		"an owned Service in sync: nothing to write": {
			in:         Input{Resource: resource(nil), Live: liveSvc(nil), Owned: inSync},
			wantStatus: metav1.ConditionTrue, wantReason: ReasonSynced,
		},
		"an owned Service out of sync: apply": {
			in:        Input{Resource: resource(func(s *v1alpha1.ServiceWithHealthchecks) { s.Labels = map[string]string{"a": "b"} }), Live: liveSvc(nil), Owned: inSync},
			wantApply: true, wantStatus: metav1.ConditionTrue, wantReason: ReasonSynced,
		},
		"a foreign Service: touch nothing and say so": {
			in:         Input{Resource: resource(nil), Live: liveSvc(func(s *corev1.Service) { s.OwnerReferences = nil })},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonForeignService, wantInMessage: wellknown.AnnotationAdopt,
		},
		"a Service of another controller: touch nothing and name the controller": {
			in: Input{Resource: resource(nil), Live: liveSvc(func(s *corev1.Service) {
				s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "x", UID: "u", Controller: ptr.To(true)}}
			})},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonForeignService, wantInMessage: "Deployment x",
		},
		"a stale Service: delete it": {
			in: Input{Resource: resource(nil), Live: liveSvc(func(s *corev1.Service) {
				s.OwnerReferences = []metav1.OwnerReference{slicemeta.OwnerReference("web", "dead")}
			})},
			wantDelete: true, wantStatus: metav1.ConditionFalse, wantReason: ReasonReplacingService,
		},
		"an adoptable Service whose ports lack a ready endpoint while its selector selects pods: adopt, keep the selector": {
			in:        Input{Resource: resource(nil), Live: liveSvc(adoptable), PortsWithoutReady: []string{"http"}, SelectsPods: true},
			wantApply: true, wantAdopt: true, wantStatus: metav1.ConditionFalse, wantReason: ReasonSelectorPending, wantInMessage: "waiting for a ready endpoint on port(s) http",
		},
		"an adoptable Service whose selector selects no pod: adopt and clear at once": {
			in:        Input{Resource: resource(nil), Live: liveSvc(adoptable), PortsWithoutReady: []string{"http"}, SelectsPods: false},
			wantApply: true, wantAdopt: true, wantClear: true, wantStatus: metav1.ConditionTrue, wantReason: ReasonSynced,
		},
		"an adopted Service whose every port has a ready endpoint: clear the selector": {
			in: Input{Resource: resource(nil), Live: liveSvc(func(s *corev1.Service) { s.Spec.Selector = map[string]string{"app": "web"} }),
				Owned: inSync, SelectsPods: true},
			wantClear: true, wantStatus: metav1.ConditionTrue, wantReason: ReasonSynced,
		},
		"an adopted Service with a port the resource lacks keeps its selector and says so": {
			in: Input{Resource: resource(nil), Live: liveSvc(func(s *corev1.Service) {
				adoptable(s)
				s.Spec.Ports = []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}, {Port: 8443, Protocol: corev1.ProtocolTCP}}
			})},
			wantApply: true, wantAdopt: true, wantStatus: metav1.ConditionFalse, wantReason: ReasonExtraPorts, wantInMessage: "8443/TCP",
		},
		"a port the controller owns and the resource dropped is no extra port: the apply removes it": {
			in: Input{Resource: resource(nil), Live: liveSvc(func(s *corev1.Service) {
				s.Spec.Ports = []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}, {Port: 8443, Protocol: corev1.ProtocolTCP}}
			}), Owned: Desired(resource(func(s *v1alpha1.ServiceWithHealthchecks) {
				s.Spec.Ports = append(s.Spec.Ports, v1alpha1.ServicePort{Name: "https", Protocol: corev1.ProtocolTCP, Port: 8443})
			}), corev1ac.Service("web", "apps"))},
			wantApply: true, wantStatus: metav1.ConditionTrue, wantReason: ReasonSynced,
		},
		"a cluster IP the spec asks for after creation is not applied, and said so": {
			in:         Input{Resource: resource(func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.ClusterIP = "10.0.0.99" }), Live: liveSvc(nil), Owned: inSync},
			wantStatus: metav1.ConditionTrue, wantReason: ReasonClusterIPNotChanged, wantInMessage: "10.0.0.99",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := Decide(tc.in)
			assert.Equal(t, tc.wantCreate, p.Create != nil, "create")
			assert.Equal(t, tc.wantApply, p.Apply != nil, "apply")
			assert.Equal(t, tc.wantAdopt, p.Adopt, "adopt")
			assert.Equal(t, tc.wantClear, p.ClearSelector, "clear selector")
			assert.Equal(t, tc.wantDelete, p.DeleteStale, "delete stale")
			assert.Equal(t, v1alpha1.ConditionServiceSynced, p.Synced.Type)
			assert.Equal(t, tc.wantStatus, p.Synced.Status)
			assert.Equal(t, tc.wantReason, p.Synced.Reason)
			assert.Contains(t, p.Synced.Message, tc.wantInMessage)
		})
	}
}

func TestControlledByResource(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference("web", "any")}}}
	require.True(t, ControlledByResource(svc, "web"))
	require.False(t, ControlledByResource(svc, "db"))
	require.False(t, ControlledByResource(&corev1.Service{}, "web"))
}
