// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package status

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

const testUID = types.UID("0b5e3f4c-uid")

// adoptee is a resource "web" with one port http 80 -> 8080, changed by mods.
func adoptee(mods ...func(*v1alpha1.ServiceWithHealthchecks)) *v1alpha1.ServiceWithHealthchecks {
	s := &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: testUID},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{Ports: []v1alpha1.ServicePort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
		}},
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

// TestPortsWithoutReadyEndpoint: the adoption clears the selector only once every port has a
// ready endpoint of ours (DESIGN §11), read from the same per-port counts as the status.
func TestPortsWithoutReadyEndpoint(t *testing.T) {
	twoPorts := adoptee(func(s *v1alpha1.ServiceWithHealthchecks) {
		s.Spec.Ports = append(s.Spec.Ports, v1alpha1.ServicePort{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9090})
	})
	ready := func(r bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &r}}
	}
	slice := func(port string, uid types.UID, managedBy string, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
		key := slicemeta.SliceKey{Resource: "web", Port: port, Node: "n1"}
		s := discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: key.Name(), Labels: key.Labels(), OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference("web", uid)}},
			Endpoints:  eps,
		}
		s.Labels[discoveryv1.LabelManagedBy] = managedBy
		return s
	}
	tests := map[string]struct {
		swh    *v1alpha1.ServiceWithHealthchecks
		slices []discoveryv1.EndpointSlice
		want   []string
	}{
		"no slices: every port waits": {swh: twoPorts, want: []string{"http", "metrics"}},
		"one port with a ready endpoint": {
			swh: twoPorts, slices: []discoveryv1.EndpointSlice{slice("http", testUID, wellknown.ManagedBy, ready(true))}, want: []string{"metrics"},
		},
		"every port with a ready endpoint": {swh: twoPorts, slices: []discoveryv1.EndpointSlice{
			slice("http", testUID, wellknown.ManagedBy, ready(false), ready(true)), slice("metrics", testUID, wellknown.ManagedBy, ready(true)),
		}},
		"a slice whose endpoints are all not ready does not count": {swh: twoPorts, slices: []discoveryv1.EndpointSlice{
			slice("http", testUID, wellknown.ManagedBy, ready(false)), slice("metrics", testUID, wellknown.ManagedBy, ready(true)),
		}, want: []string{"http"}},
		"an empty slice does not count": {swh: twoPorts, slices: []discoveryv1.EndpointSlice{
			slice("http", testUID, wellknown.ManagedBy), slice("metrics", testUID, wellknown.ManagedBy, ready(true)),
		}, want: []string{"http"}},
		"a missing ready condition counts as ready, as kube-proxy reads it": {swh: twoPorts, slices: []discoveryv1.EndpointSlice{
			slice("http", testUID, wellknown.ManagedBy, discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}}),
			slice("metrics", testUID, wellknown.ManagedBy, ready(true)),
		}},
		"a ready endpoint in another node's slice of the port counts": {swh: twoPorts, slices: func() []discoveryv1.EndpointSlice {
			other := slice("http", testUID, wellknown.ManagedBy, ready(true))
			other.Name += "-n2"
			return []discoveryv1.EndpointSlice{slice("http", testUID, wellknown.ManagedBy, ready(false)), other, slice("metrics", testUID, wellknown.ManagedBy, ready(true))}
		}()},
		"a slice of a deleted resource does not count": {swh: twoPorts, slices: []discoveryv1.EndpointSlice{
			slice("http", "dead", wellknown.ManagedBy, ready(true)), slice("metrics", testUID, wellknown.ManagedBy, ready(true)),
		}, want: []string{"http"}},
		"another controller's slice does not count": {swh: twoPorts, slices: []discoveryv1.EndpointSlice{
			slice("http", testUID, "endpointslice-controller.k8s.io", ready(true)), slice("metrics", testUID, wellknown.ManagedBy, ready(true)),
		}, want: []string{"http"}},
		"a single unnamed port is named by its number": {
			swh: adoptee(func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Ports[0].Name = "" }), want: []string{"80"},
		},
		"a single unnamed port is covered by a slice with an empty port label": {
			swh:    adoptee(func(s *v1alpha1.ServiceWithHealthchecks) { s.Spec.Ports[0].Name = "" }),
			slices: []discoveryv1.EndpointSlice{slice("", testUID, wellknown.ManagedBy, ready(true))},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, WithoutReadyIn(tc.swh, Owned(tc.swh, tc.slices), nil), "no Service families: any family counts")
			assert.Equal(t, tc.want, WithoutReady(Ports(tc.swh, Owned(tc.swh, tc.slices))), "the same as the counts say")
			assert.Equal(t, tc.want, WithoutReadyIn(tc.swh, Owned(tc.swh, tc.slices), []corev1.IPFamily{corev1.IPv4Protocol}), "an IPv4 Service's ports, from the IPv4 slices")
		})
	}
}

// A dual-stack Service is adopted only once every port has a ready endpoint of ours in both
// families: kube-proxy routes each ClusterIP from the slices of its family alone, so clearing the
// selector earlier would leave one ClusterIP without endpoints once the built-in slices go.
func TestPortsWithoutReadyEndpointInEveryFamily(t *testing.T) {
	twoPorts := adoptee(func(s *v1alpha1.ServiceWithHealthchecks) {
		s.Spec.Ports = append(s.Spec.Ports, v1alpha1.ServicePort{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9090})
	})
	slice := func(port string, family discoveryv1.AddressType, addr string, ready bool) discoveryv1.EndpointSlice {
		key := slicemeta.SliceKey{Resource: "web", Port: port, Node: "n1", AddressType: family}
		return discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: key.Name(), Labels: key.Labels(), OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference("web", testUID)}},
			AddressType: family,
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: &ready},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "web-0", UID: "uid-web-0"}}},
		}
	}
	v4, v6 := discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	dual := []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	tests := map[string]struct {
		families []corev1.IPFamily
		slices   []discoveryv1.EndpointSlice
		want     []string
	}{
		"both families ready on both ports": {families: dual, slices: []discoveryv1.EndpointSlice{
			slice("http", v4, "10.0.0.1", true), slice("http", v6, "fd00::1", true),
			slice("metrics", v4, "10.0.0.1", true), slice("metrics", v6, "fd00::1", true),
		}},
		"a port ready over IPv4 only waits for IPv6": {families: dual, slices: []discoveryv1.EndpointSlice{
			slice("http", v4, "10.0.0.1", true),
			slice("metrics", v4, "10.0.0.1", true), slice("metrics", v6, "fd00::1", true),
		}, want: []string{"http (IPv6)"}},
		"a not-ready IPv6 endpoint does not count": {families: dual, slices: []discoveryv1.EndpointSlice{
			slice("http", v4, "10.0.0.1", true), slice("http", v6, "fd00::1", false),
			slice("metrics", v4, "10.0.0.1", true), slice("metrics", v6, "fd00::1", true),
		}, want: []string{"http (IPv6)"}},
		"a port ready in no family is named alone": {families: dual, slices: []discoveryv1.EndpointSlice{
			slice("metrics", v6, "fd00::1", true),
		}, want: []string{"http", "metrics (IPv4)"}},
		"an IPv6 Service counts its IPv6 slices only": {families: []corev1.IPFamily{corev1.IPv6Protocol}, slices: []discoveryv1.EndpointSlice{
			slice("http", v4, "10.0.0.1", true), slice("metrics", v6, "fd00::1", true),
		}, want: []string{"http"}},
		"a single-stack IPv4 Service does not wait for IPv6": {families: []corev1.IPFamily{corev1.IPv4Protocol}, slices: []discoveryv1.EndpointSlice{
			slice("http", v4, "10.0.0.1", true), slice("metrics", v4, "10.0.0.1", true),
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, WithoutReadyIn(twoPorts, tc.slices, tc.families))
		})
	}
}
