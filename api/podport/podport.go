// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package podport resolves a Service port's target port on a pod (DESIGN §3, rule 1), the one
// rule the agent publishes by and the controller's audit checks the published port against.
package podport

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Resolve resolves a target port on a pod: a number is itself, a name is looked up in the pod's
// container ports (for the protocol; empty is TCP). ok is false when the pod has no container
// port of that name, or when target is empty or zero (ServicePort.EffectiveTargetPort is never
// empty).
func Resolve(pod *corev1.Pod, target intstr.IntOrString, protocol corev1.Protocol) (int32, bool) {
	switch {
	case target.Type == intstr.String && target.StrVal != "":
		if protocol == "" {
			protocol = corev1.ProtocolTCP
		}
		for _, c := range pod.Spec.Containers {
			for _, cp := range c.Ports {
				cpProto := cp.Protocol
				if cpProto == "" {
					cpProto = corev1.ProtocolTCP
				}
				if cp.Name == target.StrVal && cpProto == protocol {
					return cp.ContainerPort, true
				}
			}
		}
		return 0, false
	case target.Type == intstr.Int && target.IntVal != 0:
		return target.IntVal, true
	default:
		return 0, false
	}
}
