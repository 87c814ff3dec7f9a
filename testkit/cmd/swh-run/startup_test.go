// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

func TestReadyEndpoints(t *testing.T) {
	ptr := func(b bool) *bool { return &b }
	port := func(name string, n int32) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Name: &name, Port: &n}
	}
	ep := func(ready *bool, addrs ...string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: addrs, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
	}
	slice := func(family discoveryv1.AddressType, p discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
		return discoveryv1.EndpointSlice{AddressType: family, Ports: []discoveryv1.EndpointPort{p}, Endpoints: eps}
	}
	tests := map[string]struct {
		slices []discoveryv1.EndpointSlice
		port   string
		family corev1.IPFamily
		want   []string
	}{
		"no slices: nothing to route to": {port: "http", family: corev1.IPv4Protocol, want: []string{}},
		"ready endpoints of every node's slice, sorted": {
			slices: []discoveryv1.EndpointSlice{
				slice(discoveryv1.AddressTypeIPv4, port("http", 8080), ep(ptr(true), "198.18.0.9")),
				slice(discoveryv1.AddressTypeIPv4, port("http", 8080), ep(ptr(true), "198.18.0.10"), ep(ptr(false), "198.18.0.11")),
			},
			port: "http", family: corev1.IPv4Protocol, want: []string{"198.18.0.10:8080", "198.18.0.9:8080"},
		},
		"no ready condition is ready, as kube-proxy reads it": {
			slices: []discoveryv1.EndpointSlice{slice(discoveryv1.AddressTypeIPv4, port("http", 8080), ep(nil, "198.18.0.9"))},
			port:   "http", family: corev1.IPv4Protocol, want: []string{"198.18.0.9:8080"},
		},
		"another port's slice is not this port's": {
			slices: []discoveryv1.EndpointSlice{slice(discoveryv1.AddressTypeIPv4, port("rest", 8080), ep(ptr(true), "198.18.0.9"))},
			port:   "grpc", family: corev1.IPv4Protocol, want: []string{},
		},
		"the family's slices only, IPv6 bracketed": {
			slices: []discoveryv1.EndpointSlice{
				slice(discoveryv1.AddressTypeIPv4, port("http", 8080), ep(ptr(true), "198.18.0.9")),
				slice(discoveryv1.AddressTypeIPv6, port("http", 8080), ep(ptr(true), "2001:2:1::4")),
			},
			port: "http", family: corev1.IPv6Protocol, want: []string{"[2001:2:1::4]:8080"},
		},
		"a split port: each slice its own target port": {
			slices: []discoveryv1.EndpointSlice{
				slice(discoveryv1.AddressTypeIPv4, port("http", 8080), ep(ptr(true), "198.18.0.9")),
				slice(discoveryv1.AddressTypeIPv4, port("http", 8081), ep(ptr(true), "198.18.0.10")),
			},
			port: "http", family: corev1.IPv4Protocol, want: []string{"198.18.0.10:8081", "198.18.0.9:8080"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, readyEndpoints(tc.slices, tc.port, tc.family))
		})
	}
}

// A loop in its start-up shows what it waits for and no counts; once it counts, its line has
// the window's counts and those since its start-up, and a failure in either shows.
func TestTrafficLine(t *testing.T) {
	tests := map[string]struct {
		sum  Summary
		want string
	}{
		"in its start-up": {
			sum:  Summary{Service: "web", Proto: protoHTTP, Target: "198.19.128.10:80", StartUp: 3200 * time.Millisecond, Waiting: "waiting for kube-proxy to route it to 198.18.0.9:8080 (it routes to none)"},
			want: "  traffic http 198.19.128.10:80: starting (3s): waiting for kube-proxy to route it to 198.18.0.9:8080 (it routes to none)\n",
		},
		"counting": {
			sum: Summary{Service: "web", Proto: protoHTTP, Target: "198.19.128.10:80", OK: 99, ByPod: map[string]int{"demo/vm-0": 99},
				CountFrom: time.Unix(100, 0), CountFromUp: 26500 * time.Millisecond, TotalOK: 1234},
			want: "  traffic http 198.19.128.10:80: 99 ok, 0 failed · answered: vm-0 99 · since up 26s: 1234 ok, 0 failed\n",
		},
		"a failure after the start-up": {
			sum: Summary{Service: "smtp", Proto: protoSMTP, Target: "198.19.128.11:25", OK: 40, Failed: 2, ByPod: map[string]int{"demo/vm-0": 40},
				LastErr: "connect: connection refused", CountFrom: time.Unix(100, 0), CountFromUp: 20 * time.Second, TotalOK: 500, TotalFailed: 2},
			want: "  traffic smtp 198.19.128.11:25: 40 ok, 2 failed · answered: vm-0 40 · last failure: connect: connection refused · since up 20s: 500 ok, 2 failed\n",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var b strings.Builder
			writeResource(&b, &ResourceView{Name: tc.sum.Service, ClusterIP: "198.19.128.10", Ready: "True"}, []Summary{tc.sum})
			lines := strings.SplitAfter(b.String(), "\n")
			assert.Equal(t, tc.want, lines[len(lines)-2])
		})
	}
}

func TestFailedSinceStartUp(t *testing.T) {
	v := &View{Traffic: map[string]Summary{
		"web":     {TotalOK: 10},
		"smtp":    {TotalOK: 8, TotalFailed: 2, CountFromUp: 12 * time.Second, FirstFailureUp: 20250 * time.Millisecond, FirstFailure: "connect: connection refused"},
		"db-read": {TotalOK: 3, TotalFailed: 1, CountFromUp: 9 * time.Second, FirstFailureUp: 9 * time.Second, FirstFailure: "i/o timeout"},
	}}
	assert.EqualError(t, failedSinceStartUp(v), "requests failed after their Service's start-up: "+
		"db-read 1 of 4 (the first at up 9s, counting from up 9s: i/o timeout), "+
		"smtp 2 of 10 (the first at up 20.2s, counting from up 12s: connect: connection refused)")
	assert.NoError(t, failedSinceStartUp(&View{Traffic: map[string]Summary{"web": {TotalOK: 10}}}))
}
