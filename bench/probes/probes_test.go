// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package probes benchmarks the kubelet's own TCP, HTTP and gRPC probe code against the same kind of
// local servers that images/agent/internal/prober/bench_test.go uses for ours, so both can be
// compared in one run (run.sh). This module stays outside go.work: it pulls k8s.io/kubernetes.
package probes

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/kubernetes/pkg/probe"
	httpprobe "k8s.io/kubernetes/pkg/probe/http"
	tcpprobe "k8s.io/kubernetes/pkg/probe/tcp"
)

// acceptAndClose is the TCP target: it accepts and closes every connection.
func acceptAndClose(b *testing.B) int {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// okServer is the HTTP target: 200 with a two-byte body.
func okServer(b *testing.B) int {
	b.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	b.Cleanup(srv.Close)
	_, p, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(p)
	return port
}

func BenchmarkKubeletTCP(b *testing.B) {
	port := acceptAndClose(b)
	pr := tcpprobe.New()
	b.ReportAllocs()
	for b.Loop() {
		res, out, err := pr.Probe("127.0.0.1", port, time.Second)
		if err != nil || res != probe.Success {
			b.Fatalf("probe: %v %s %v", res, out, err)
		}
	}
}

func BenchmarkKubeletHTTP(b *testing.B) {
	port := okServer(b)
	pr := httpprobe.New(false)
	action := &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(int32(port)), Scheme: corev1.URISchemeHTTP}
	container := &corev1.Container{}
	b.ReportAllocs()
	for b.Loop() {
		// The kubelet builds the request for every run (pkg/kubelet/prober.runProbe).
		req, err := httpprobe.NewRequestForHTTPGetAction(action, container, "127.0.0.1", "probe")
		if err != nil {
			b.Fatal(err)
		}
		res, out, err := pr.Probe(req, time.Second)
		if err != nil || res != probe.Success {
			b.Fatalf("probe: %v %s %v", res, out, err)
		}
	}
}
