// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package podport_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/podport"
)

func TestResolve(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {ContainerPort: 9000}}},
		{Ports: []corev1.ContainerPort{{Name: "dns", ContainerPort: 5353, Protocol: corev1.ProtocolUDP}}},
	}}}
	tests := map[string]struct {
		target   intstr.IntOrString
		protocol corev1.Protocol
		want     int32
		ok       bool
	}{
		"a number is itself":                          {target: intstr.FromInt32(443), want: 443, ok: true},
		"a name is the container port of that name":   {target: intstr.FromString("http"), want: 8080, ok: true},
		"an empty protocol is TCP on both sides":      {target: intstr.FromString("http"), protocol: corev1.ProtocolTCP, want: 8080, ok: true},
		"a name of another protocol does not resolve": {target: intstr.FromString("dns"), protocol: corev1.ProtocolTCP},
		"a name with its protocol resolves":           {target: intstr.FromString("dns"), protocol: corev1.ProtocolUDP, want: 5353, ok: true},
		"a name the pod lacks does not resolve":       {target: intstr.FromString("smtp")},
		"an empty name never matches an unnamed port": {target: intstr.FromString("")},
		"zero does not resolve":                       {target: intstr.FromInt32(0)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := podport.Resolve(pod, tc.target, tc.protocol)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}
