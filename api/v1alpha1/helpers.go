// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	"strconv"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// EffectiveTargetPort is where the Service port sends traffic on the pod: targetPort, or port
// when targetPort is omitted (0 or "", which is what Go clients send for an unset value). The
// controller writes it into the child Service and the agent resolves it per pod, so the rule
// lives here once.
func (p ServicePort) EffectiveTargetPort() intstr.IntOrString {
	t := p.TargetPort
	if t.Type == intstr.Int && t.IntVal == 0 || t.Type == intstr.String && t.StrVal == "" {
		return intstr.FromInt32(p.Port)
	}
	return t
}

// DisplayName names the port in messages, Events and status: its name, or its number when it
// has none (a resource with a single unnamed port).
func (p ServicePort) DisplayName() string {
	if p.Name != "" {
		return p.Name
	}
	return strconv.Itoa(int(p.Port))
}

// DisplayName names the port in messages: its name, or its number when it has none.
func (p PortStatus) DisplayName() string {
	return ServicePort{Name: p.Name, Port: p.Port}.DisplayName()
}

// TargetPort is the target port of the probe's own block (tcp, http, postgreSQL, mySQL or grpc); the zero
// value when the probe has none.
func (p Probe) TargetPort() intstr.IntOrString {
	switch {
	case p.TCP != nil:
		return p.TCP.TargetPort
	case p.HTTP != nil:
		return p.HTTP.TargetPort
	case p.PostgreSQL != nil:
		return p.PostgreSQL.TargetPort
	case p.MySQL != nil:
		return p.MySQL.TargetPort
	case p.GRPC != nil:
		return p.GRPC.TargetPort
	}
	return intstr.IntOrString{}
}

// ServiceOwned tells whether the controller last saw the child Service as this resource's own:
// created by it, or adopted (its controller owner reference carries this resource's UID, which
// an adoption sets on its first step, before the selector is cleared). The controller sets
// status.clusterIP exactly then and clears it while the Service is absent, foreign or left by a
// deleted resource of the same name; every controller version has written it so, which makes it
// the ownership signal the agents gate publishing on (DESIGN §8). A headless Service's is "None".
func (s ServiceWithHealthchecksStatus) ServiceOwned() bool {
	return s.ClusterIP != ""
}
