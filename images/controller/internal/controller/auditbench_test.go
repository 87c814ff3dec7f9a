// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// BenchmarkForgedSliceRemoval measures, against the real API server of this package, the time
// from a forged slice's first write to the moment no slice carries the forgery any more, with
// the controller's audit at its defaults (window audit.DefaultWindow, audit.DefaultWorkers):
//
//   - single: one forged slice, written once;
//   - rotated: the forger deletes its slice before the window closes (every 0.6 window) and
//     writes the same forgery under the other of two names;
//   - churned: the forger rewrites an annotation of its slice every second;
//   - repeated: a forgery already confirmed for the node, written again under a new name;
//   - redundant: a further chunk, named as the node's own, that repeats the real endpoint its
//     audited-clean chunk 0 lists (no forgery: deleted as redundant after the window).
//
// Each iteration forges a new address (so only "repeated" finds it remembered). Every slice
// carries a name of its node's (a chunk of the port): a name that is not its node's is removed
// by the garbage collection at once (squatting), which would measure that instead of the audit.
// It reports the p50 and p99 in ms (development/BENCHMARKS.md). Run:
//
//	go test -run '^$' -bench '^BenchmarkForgedSliceRemoval$' -benchtime 20x ./internal/controller/
func BenchmarkForgedSliceRemoval(b *testing.B) {
	ctx := b.Context()
	ns := env.CreateNamespaceForTest(b, "auditbench")
	o := Options{
		MetricsBindAddress: "0", HealthProbeBindAddress: "0", Namespaces: []string{ns},
		Registry: prometheus.NewRegistry(), SkipNameValidation: true, Logger: logr.Discard(),
	}
	mgr, _, err := NewManager(env.Config, o)
	if err != nil {
		b.Fatal(err)
	}
	mctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	b.Cleanup(func() { cancel(); <-done })

	nodeName := ns + "-node-a"
	must(b, env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}))
	b.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	})
	swh := &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{Selector: map[string]string{"app": "web"},
			Ports: []v1alpha1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	must(b, env.Client.Create(ctx, swh))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-1", Labels: map[string]string{"app": "web"}},
		Spec:       corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "app", Image: "app"}}},
	}
	must(b, env.Client.Create(ctx, pod))
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.7.0.1", PodIPs: []corev1.PodIP{{IP: "10.7.0.1"}}}
	must(b, env.Client.Status().Update(ctx, pod))
	// The audit reads the resource from its cache: wait until the controller has reconciled it.
	for {
		must(b, env.Client.Get(ctx, client.ObjectKeyFromObject(swh), swh))
		if len(swh.Status.Conditions) > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	// chunk is a slice of the node's own chunk k (its name and labels as the agent writes them;
	// 0 is the common name) listing web-1 at addr.
	chunk := func(k int, addr string) *discoveryv1.EndpointSlice {
		key := slicemeta.SliceKey{Resource: "web", Port: "http", Node: nodeName, Chunk: k}
		return &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: key.Name(), Namespace: ns, Labels: key.Labels(), Annotations: key.Annotations(),
				OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference("web", swh.UID)}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{{
				Addresses:  []string{addr},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
				NodeName:   ptr.To(nodeName),
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod.Name, UID: pod.UID},
			}},
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
		}
	}
	exists := func(name string) bool {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &discoveryv1.EndpointSlice{})
		if err != nil && !apierrors.IsNotFound(err) {
			b.Fatal(err)
		}
		return err == nil
	}
	const poll = 5 * time.Millisecond
	seq := 0
	addr := func() string { seq++; return fmt.Sprintf("10.99.%d.%d", seq/250, seq%250+1) }

	gone := func(s *discoveryv1.EndpointSlice) time.Duration {
		start := time.Now()
		must(b, env.Client.Create(ctx, s))
		for exists(s.Name) {
			time.Sleep(poll)
		}
		return time.Since(start)
	}
	cases := []struct {
		name  string
		prime func()
		run   func(i int) time.Duration
	}{
		{"single", nil, func(i int) time.Duration { return gone(chunk(1000+i, addr())) }},
		{"rotated", nil, func(i int) time.Duration {
			a := addr()
			start := time.Now()
			for k := 0; ; k++ {
				s := chunk(2000+2*i+k%2, a)
				if err := env.Client.Create(ctx, s); err != nil {
					b.Fatal(err)
				}
				rotateAt := time.Now().Add(900 * time.Millisecond) // 0.6 of the 1.5 s window
				for exists(s.Name) && time.Now().Before(rotateAt) {
					time.Sleep(poll)
				}
				if !exists(s.Name) {
					return time.Since(start)
				}
				if err := env.Client.Delete(ctx, s); err != nil && !apierrors.IsNotFound(err) {
					b.Fatal(err)
				}
			}
		}},
		{"churned", nil, func(i int) time.Duration {
			s := chunk(3000+i, addr())
			start := time.Now()
			must(b, env.Client.Create(ctx, s))
			next := time.Now().Add(time.Second)
			for n := 0; exists(s.Name); {
				if time.Now().After(next) {
					var cur discoveryv1.EndpointSlice
					if env.Client.Get(ctx, client.ObjectKeyFromObject(s), &cur) == nil {
						n++
						metav1.SetMetaDataAnnotation(&cur.ObjectMeta, "churn", fmt.Sprint(n))
						_ = env.Client.Update(ctx, &cur)
					}
					next = next.Add(time.Second)
				}
				time.Sleep(poll)
			}
			return time.Since(start)
		}},
		{"repeated", func() { gone(chunk(4000, "10.98.0.1")) }, func(i int) time.Duration {
			return gone(chunk(4001+i, "10.98.0.1"))
		}},
		{"redundant", func() {
			// The honest chunk 0 of the node, listing web-1 at its real address; one redundant
			// chunk removed outside the samples shows that the audit has found chunk 0 clean.
			must(b, env.Client.Create(ctx, chunk(0, pod.Status.PodIP)))
			gone(chunk(1, pod.Status.PodIP))
		}, func(i int) time.Duration { return gone(chunk(i+2, pod.Status.PodIP)) }},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			if tc.prime != nil {
				tc.prime() // Confirmed once, outside the samples.
			}
			var took []time.Duration
			for i := 0; b.Loop(); i++ {
				took = append(took, tc.run(i))
			}
			slices.Sort(took)
			pct := func(p float64) float64 {
				return float64(took[min(len(took)-1, int(p*float64(len(took))))].Microseconds()) / 1000
			}
			b.ReportMetric(pct(0.5), "p50-ms")
			b.ReportMetric(pct(0.99), "p99-ms")
			b.ReportMetric(float64(took[len(took)-1].Microseconds())/1000, "max-ms")
		})
	}
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}
