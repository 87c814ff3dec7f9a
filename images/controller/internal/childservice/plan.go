// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package childservice

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// Reasons of the ServiceSynced condition.
const (
	// ReasonSynced: the Service exists and matches the resource.
	ReasonSynced = "Synced"
	// ReasonClusterIPNotChanged: the Service matches except for a cluster IP the resource asks
	// for that differs from the one the Service has; cluster IPs are set only at creation.
	ReasonClusterIPNotChanged = "ClusterIPNotChanged"
	// ReasonForeignService: a Service of that name belongs to someone else; it is left untouched.
	ReasonForeignService = "ForeignService"
	// ReasonSelectorPending: the Service (being adopted) still has a selector, kept until this
	// module's EndpointSlices hold a ready endpoint for every port.
	ReasonSelectorPending = "SelectorPending"
	// ReasonExtraPorts: the Service has ports the resource does not list, set by another field
	// manager (typically before adoption); they are neither served by this module's slices nor
	// removed, and the selector is kept while they exist.
	ReasonExtraPorts = "ExtraPorts"
	// ReasonReplacingService: a Service left by a deleted resource of the same name is replaced.
	ReasonReplacingService = "ReplacingService"
	// ReasonInvalid: the API server rejected the Service the resource asks for.
	ReasonInvalid = "Invalid"
	// ReasonWriteFailed: writing the Service failed for another reason; it is retried.
	ReasonWriteFailed = "WriteFailed"
)

// Input is what the controller observed about one live resource and its Service.
type Input struct {
	// Resource is the live ServiceWithHealthchecks.
	Resource *v1alpha1.ServiceWithHealthchecks
	// Live is the Service of the same name, nil when there is none.
	Live *corev1.Service
	// Owned is what the controller's field manager owns in Live (nil when Live is nil).
	Owned *corev1ac.ServiceApplyConfiguration
	// PortsWithoutReady are the ports of the resource without a ready endpoint in the
	// EndpointSlices of this resource in some family of Live ("http", or "http (IPv6)" for a
	// dual-stack Service that lacks one family: status.WithoutReadyIn). The selector of an
	// adopted Service is cleared only when it is empty, so neither ClusterIP loses its
	// endpoints in the switch.
	PortsWithoutReady []string
	// SelectsPods tells whether Live's selector selects any pod. Only consulted when
	// NeedsPodCheck says so; false otherwise.
	SelectsPods bool
}

// Plan is what the controller does with the Service of one resource.
type Plan struct {
	// Ownership of the existing Service.
	Ownership Ownership
	// Create is the Service to create (Ownership Absent).
	Create *corev1ac.ServiceApplyConfiguration
	// Apply is the configuration to apply to an owned or adoptable Service; nil when nothing the
	// controller owns would change.
	Apply *corev1ac.ServiceApplyConfiguration
	// Adopt is set when Apply takes over a Service that was not owned yet.
	Adopt bool
	// DeleteStale is set when the Service is garbage of a deleted resource of the same name.
	DeleteStale bool
	// ClearSelector is set when the Service's selector may be cleared now.
	ClearSelector bool
	// Synced is the ServiceSynced condition once the planned writes succeed (no
	// LastTransitionTime or ObservedGeneration yet).
	Synced metav1.Condition
}

// NeedsPodCheck tells whether the plan depends on whether the live Service's selector selects any
// pod: only for an owned or adoptable Service with a selector while some port has no ready
// endpoint in this resource's slices yet.
func NeedsPodCheck(swh *v1alpha1.ServiceWithHealthchecks, live *corev1.Service, portsWithoutReady []string) bool {
	if live == nil || len(live.Spec.Selector) == 0 || len(portsWithoutReady) == 0 {
		return false
	}
	o := Classify(swh, live)
	return o == Owned || o == Adoptable
}

// Decide plans the writes to the Service of one live resource.
func Decide(in Input) Plan {
	swh, live := in.Resource, in.Live
	p := Plan{Ownership: Classify(swh, live)}
	name := swh.Namespace + "/" + swh.Name
	switch p.Ownership {
	case Absent:
		p.Create = Desired(swh, nil)
		p.Synced = condition(metav1.ConditionTrue, ReasonSynced, "Service %s matches the resource", name)
		return p
	case Stale:
		p.DeleteStale = true
		p.Synced = condition(metav1.ConditionFalse, ReasonReplacingService,
			"Service %s belongs to a deleted ServiceWithHealthchecks of the same name; it is deleted and created anew", name)
		return p
	case Foreign:
		if ctl := metav1.GetControllerOfNoCopy(live); ctl != nil {
			p.Synced = condition(metav1.ConditionFalse, ReasonForeignService,
				"Service %s is controlled by %s %s and is left untouched; delete it or rename this resource", name, ctl.Kind, ctl.Name)
		} else {
			p.Synced = condition(metav1.ConditionFalse, ReasonForeignService,
				"Service %s exists and is not owned by this resource, so it is left untouched; delete it, or annotate it %s=true to let this resource adopt it",
				name, wellknown.AnnotationAdopt)
		}
		return p
	case Owned, Adoptable:
	}

	desired := Desired(swh, in.Owned)
	if p.Ownership == Adoptable || Changed(desired, in.Owned) {
		p.Apply = desired
	}
	p.Adopt = p.Ownership == Adoptable

	if extra := extraPorts(swh, live, in.Owned); len(extra) > 0 {
		p.Synced = condition(metav1.ConditionFalse, ReasonExtraPorts,
			"Service %s has port(s) %s that the resource does not list; another field manager set them, so they are not removed and the Service's selector is kept: remove them from the Service or add them to the resource",
			name, strings.Join(extra, ", "))
		return p
	}
	if len(live.Spec.Selector) > 0 {
		if len(in.PortsWithoutReady) == 0 || !in.SelectsPods {
			p.ClearSelector = true
		} else {
			p.Synced = condition(metav1.ConditionFalse, ReasonSelectorPending,
				"adopting: waiting for a ready endpoint on port(s) %s; Service %s keeps its selector %s until this module's EndpointSlices have one for every port, so traffic keeps flowing during the switch",
				strings.Join(in.PortsWithoutReady, ", "), name, formatSelector(live.Spec.Selector))
			return p
		}
	}
	if ip := swh.Spec.ClusterIP; ip != "" && ip != live.Spec.ClusterIP {
		p.Synced = condition(metav1.ConditionTrue, ReasonClusterIPNotChanged,
			"Service %s keeps cluster IP %s: spec.clusterIP %s is used only when the Service is created; delete and re-create the resource to change it",
			name, live.Spec.ClusterIP, ip)
		return p
	}
	p.Synced = condition(metav1.ConditionTrue, ReasonSynced, "Service %s matches the resource", name)
	return p
}

func condition(status metav1.ConditionStatus, reason, format string, args ...any) metav1.Condition {
	return metav1.Condition{
		Type:    v1alpha1.ConditionServiceSynced,
		Status:  status,
		Reason:  reason,
		Message: fmt.Sprintf(format, args...),
	}
}

func formatSelector(sel map[string]string) string {
	keys := slices.Sorted(maps.Keys(sel))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+sel[k])
	}
	return strings.Join(parts, ",")
}

// extraPorts lists the ports of live (as port/protocol) that the resource does not have and that
// the controller's next apply does not remove (because it does not own them).
func extraPorts(swh *v1alpha1.ServiceWithHealthchecks, live *corev1.Service, owned *corev1ac.ServiceApplyConfiguration) []string {
	type key struct {
		port     int32
		protocol corev1.Protocol
	}
	want := map[key]bool{}
	for _, p := range swh.Spec.Ports {
		want[key{p.Port, cmp.Or(p.Protocol, corev1.ProtocolTCP)}] = true
	}
	if owned != nil && owned.Spec != nil {
		for _, p := range owned.Spec.Ports {
			want[key{deref(p.Port), cmp.Or(deref(p.Protocol), corev1.ProtocolTCP)}] = true
		}
	}
	var extra []string
	for _, p := range live.Spec.Ports {
		if !want[key{p.Port, cmp.Or(p.Protocol, corev1.ProtocolTCP)}] {
			extra = append(extra, strconv.Itoa(int(p.Port))+"/"+string(cmp.Or(p.Protocol, corev1.ProtocolTCP)))
		}
	}
	return extra
}
