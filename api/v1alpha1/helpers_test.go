// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestEffectiveTargetPort(t *testing.T) {
	cases := map[string]struct {
		port ServicePort
		want intstr.IntOrString
	}{
		"an omitted target port is the port":          {ServicePort{Port: 80}, intstr.FromInt32(80)},
		"a zero number is what Go clients send unset": {ServicePort{Port: 80, TargetPort: intstr.FromInt32(0)}, intstr.FromInt32(80)},
		"an empty name counts as omitted":             {ServicePort{Port: 80, TargetPort: intstr.FromString("")}, intstr.FromInt32(80)},
		"a number is itself":                          {ServicePort{Port: 80, TargetPort: intstr.FromInt32(8080)}, intstr.FromInt32(8080)},
		"a name is kept for the pod to resolve":       {ServicePort{Port: 80, TargetPort: intstr.FromString("web")}, intstr.FromString("web")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.port.EffectiveTargetPort())
		})
	}
}

func TestDisplayName(t *testing.T) {
	assert.Equal(t, "web", ServicePort{Name: "web", Port: 80}.DisplayName())
	assert.Equal(t, "80", ServicePort{Port: 80}.DisplayName(), "an unnamed port is named by its number")
	assert.Equal(t, "25", PortStatus{Port: 25}.DisplayName())
}

func TestProbeTargetPort(t *testing.T) {
	assert.Equal(t, intstr.FromInt32(1), Probe{TCP: &TCPProbe{TargetPort: intstr.FromInt32(1)}}.TargetPort())
	assert.Equal(t, intstr.FromString("web"), Probe{HTTP: &HTTPProbe{TargetPort: intstr.FromString("web")}}.TargetPort())
	assert.Equal(t, intstr.FromInt32(5432), Probe{PostgreSQL: &PostgreSQLProbe{TargetPort: intstr.FromInt32(5432)}}.TargetPort())
	assert.Equal(t, intstr.FromString("grpc"), Probe{GRPC: &GRPCProbe{TargetPort: intstr.FromString("grpc")}}.TargetPort())
	assert.Equal(t, intstr.IntOrString{}, Probe{}.TargetPort(), "a probe without a block has no target")
}

func TestServiceOwnedFollowsTheClusterIPTheControllerWrites(t *testing.T) {
	assert.False(t, ServiceWithHealthchecksStatus{}.ServiceOwned(), "no status yet: the Service does not exist or is foreign")
	assert.True(t, ServiceWithHealthchecksStatus{ClusterIP: "10.0.0.1"}.ServiceOwned())
	assert.True(t, ServiceWithHealthchecksStatus{ClusterIP: "None"}.ServiceOwned(), "a headless Service of ours")
}
