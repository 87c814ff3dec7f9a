// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package status

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// WithoutReadyIn names the ports of swh (DisplayName, in spec order) that have no ready
// endpoint in the slices of some family of the Service: families are the Service's
// spec.ipFamilies, and none means that any family counts (no Service to ask yet). kube-proxy
// routes each ClusterIP from the slices of its family only, so a dual-stack Service needs a
// ready endpoint in both: a port that lacks one family is named with it, "http (IPv6)"; a port
// without a ready endpoint in any family, or of a single-stack Service, by its name alone. The
// adoption clears a Service's selector only when this is empty (DESIGN §11), and
// EndpointsAvailable is True only then.
func WithoutReadyIn(swh *v1alpha1.ServiceWithHealthchecks, sliceList []discoveryv1.EndpointSlice, families []corev1.IPFamily) []string {
	var out []string
	for _, p := range swh.Spec.Ports {
		readyIn := map[corev1.IPFamily]bool{}
		for i := range sliceList {
			s := &sliceList[i]
			if port, ok := slicemeta.PortOf(s); !ok || port != p.Name {
				continue
			}
			for j := range s.Endpoints {
				if r := s.Endpoints[j].Conditions.Ready; r == nil || *r {
					readyIn[sliceFamily(s)] = true
					break
				}
			}
		}
		var missing []string
		if len(families) == 0 {
			if len(readyIn) == 0 {
				missing = append(missing, "")
			}
		} else {
			for _, f := range families {
				if !readyIn[f] {
					missing = append(missing, string(f))
				}
			}
		}
		switch {
		case len(missing) == 0:
		case len(families) < 2 || len(missing) == len(families):
			out = append(out, p.DisplayName())
		default:
			for _, f := range missing {
				out = append(out, p.DisplayName()+" ("+f+")")
			}
		}
	}
	return out
}

// sliceFamily is the IP family of a slice's addresses (a slice without an address type, which
// the API server never returns, counts as IPv4, the default of slicemeta.SliceKey).
func sliceFamily(s *discoveryv1.EndpointSlice) corev1.IPFamily {
	if s.AddressType == discoveryv1.AddressTypeIPv6 {
		return corev1.IPv6Protocol
	}
	return corev1.IPv4Protocol
}

// ServiceFamilies are the IP families of a Service (spec.ipFamilies; nil for no Service).
func ServiceFamilies(svc *corev1.Service) []corev1.IPFamily {
	if svc == nil {
		return nil
	}
	return svc.Spec.IPFamilies
}

// Owned are the slices of this module owned by swh's UID: the only ones its status counts.
func Owned(swh *v1alpha1.ServiceWithHealthchecks, all []discoveryv1.EndpointSlice) []discoveryv1.EndpointSlice {
	var out []discoveryv1.EndpointSlice
	for i := range all {
		if slicemeta.IsOwnedBy(&all[i], swh.UID) {
			out = append(out, all[i])
		}
	}
	return out
}
