// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package probes

import (
	"crypto/tls"
	"net"
	"testing"

	"k8s.io/kubernetes/pkg/probe"
	grpcprobe "k8s.io/kubernetes/pkg/probe/grpc"

	"github.com/deckhouse/service-with-healthchecks/testkit/grpchealth"
	"github.com/deckhouse/service-with-healthchecks/testkit/pki"
)

// selfSignedTLS is a server setup for 127.0.0.1 from a fresh CA; the kubelet's gRPC probe
// accepts any certificate.
func selfSignedTLS(t testing.TB) *tls.Config {
	t.Helper()
	ca, err := pki.NewCA("grpc-ca")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Server("grpc", nil, []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pair.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}

// TestKubeletGRPCAgreesOnTheSharedCases runs the kubelet's gRPC probe on the servers of
// testkit/grpchealth.Cases; images/agent/internal/prober (TestGRPCAgreesWithTheKubeletOnTheSharedCases)
// runs the agent's on the same table, so the two reach the same verdict on each.
func TestKubeletGRPCAgreesOnTheSharedCases(t *testing.T) {
	pr := grpcprobe.New()
	for name, tc := range grpchealth.Cases(selfSignedTLS) {
		t.Run(name, func(t *testing.T) {
			port := tc.Start(t)
			res, out, err := pr.Probe("127.0.0.1", tc.Service, port, grpchealth.Timeout, grpcprobe.ProbeOptions{UseTLS: tc.TLS})
			if err != nil {
				t.Fatalf("the kubelet's gRPC probe returned an error: %v", err)
			}
			if got := res == probe.Success; got != tc.Pass {
				t.Errorf("the kubelet's verdict is %v (%s), the table says pass=%v", res, out, tc.Pass)
			}
		})
	}
}

func BenchmarkKubeletGRPC(b *testing.B) {
	s := grpchealth.Start(b, grpchealth.Options{})
	pr := grpcprobe.New()
	b.ReportAllocs()
	for b.Loop() {
		res, out, err := pr.Probe("127.0.0.1", "", s.Port(), grpchealth.Timeout, grpcprobe.ProbeOptions{})
		if err != nil || res != probe.Success {
			b.Fatalf("probe: %v %s %v", res, out, err)
		}
	}
}
