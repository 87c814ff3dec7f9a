// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package realnode_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// recordTimeline records, until the test ends, every change of the namespace's pods (node, IP,
// phase, readiness, deletion), of its EndpointSlices (address=RST conditions) and of the
// endpoints kube-proxy's rules send new connections of the Service port to, each with the time
// it was seen, and, at every new failed request of loop, the connection-tracking entries towards
// the Service's ClusterIP. A failed test prints the record: a request that fails once in many
// runs (issue 31's refused request) then comes with what the cluster looked like around it.
func recordTimeline(t *testing.T, c *cluster.Cluster, ns, service string, port int32, loop *cluster.Traffic) {
	t.Helper()
	var svc corev1.Service
	if err := c.Env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: service}, &svc); err != nil {
		t.Fatalf("reading Service %s/%s: %v", ns, service, err)
	}
	var mu sync.Mutex
	var lines []string
	logf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	every := func(what string, period time.Duration, read func(context.Context) string) {
		wg.Go(func() {
			last := ""
			for ctx.Err() == nil {
				if cur := read(ctx); cur != last && ctx.Err() == nil {
					logf("%s %s", what, cur)
					last = cur
				}
				select {
				case <-ctx.Done():
				case <-time.After(period):
				}
			}
		})
	}
	every("pods", 20*time.Millisecond, func(ctx context.Context) string {
		var list corev1.PodList
		if err := c.Env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err.Error()
		}
		var out []string
		for i := range list.Items {
			p := &list.Items[i]
			out = append(out, fmt.Sprintf("%s(%s %s %s ready=%t deleted=%t)", p.Name, p.Spec.NodeName,
				p.Status.PodIP, p.Status.Phase, podReady(p), p.DeletionTimestamp != nil))
		}
		slices.Sort(out)
		return strings.Join(out, " ")
	})
	every("slices", 20*time.Millisecond, func(ctx context.Context) string {
		var list discoveryv1.EndpointSliceList
		if err := c.Env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err.Error()
		}
		var out []string
		for i := range list.Items {
			s := &list.Items[i]
			var eps []string
			for _, e := range s.Endpoints {
				eps = append(eps, strings.Join(e.Addresses, ",")+"="+e2e.Conds(e.Conditions))
			}
			slices.Sort(eps)
			out = append(out, fmt.Sprintf("%s[%s]", s.Name, strings.Join(eps, " ")))
		}
		slices.Sort(out)
		return strings.Join(out, " ")
	})
	every(fmt.Sprintf("kube-proxy(:%d)", port), 10*time.Millisecond, func(ctx context.Context) string {
		got, err := c.ProgrammedEndpoints(ctx, ns+"/"+service, port)
		if err != nil {
			return err.Error()
		}
		slices.Sort(got)
		return fmt.Sprint(got)
	})
	wg.Go(func() {
		seen := 0
		for ctx.Err() == nil {
			if failed := loop.Results().Failed(); len(failed) > seen {
				for _, f := range failed[seen:] {
					logf("failed request started %s: %s", f.Start.Format("15:04:05.000"), f.Err)
				}
				seen = len(failed)
				logf("conntrack to %s:\n%s", svc.Spec.ClusterIP, conntrackTo(svc.Spec.ClusterIP))
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if t.Failed() {
			mu.Lock()
			defer mu.Unlock()
			t.Logf("timeline of %s:\n%s", ns, strings.Join(lines, "\n"))
		}
	})
}

// conntrackTo lists the connection-tracking entries of the test's network namespace whose
// original destination is ip, except those in TIME_WAIT (the finished requests).
func conntrackTo(ip string) string {
	f, err := os.Open("/proc/net/nf_conntrack")
	if err != nil {
		return err.Error()
	}
	defer func() { _ = f.Close() }()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := sc.Text(); strings.Contains(l, " dst="+ip+" ") && !strings.Contains(l, " TIME_WAIT ") {
			out = append(out, "  "+l)
		}
	}
	if err := sc.Err(); err != nil {
		out = append(out, err.Error())
	}
	return strings.Join(out, "\n")
}

// webTraffic starts requests through port 80 of ns/web for the rest of the test, records their
// timeline (printed if the test fails) and waits until they flow.
func webTraffic(t *testing.T, c *cluster.Cluster, ns string) *cluster.Traffic {
	t.Helper()
	loop := c.Traffic(t, cluster.TrafficOptions{Service: ns + "/web", Port: 80, Duration: 5 * time.Minute})
	recordTimeline(t, c, ns, "web", 80, loop)
	tm.WaitRequestsAfter(t, loop, time.Now(), tm.MinInWindow)
	return loop
}
