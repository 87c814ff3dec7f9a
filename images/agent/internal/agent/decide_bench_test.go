// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"fmt"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/scheduler"
)

// BenchmarkDecide measures the whole decide step of one resource on one node (the targets, the
// per-port rule, the desired slices, the diff and the transitions) with pods x 4 probes: in
// steady state (the existing slices are what the results give) and with one pod's probe turned
// failing. Run it alone on a quiet machine (development/BENCHMARKS.md):
//
//	cd images/agent && go test ./internal/agent/ -run xxx -bench BenchmarkDecide -benchmem -count 5
func BenchmarkDecide(b *testing.B) {
	for _, n := range []int{100, 1000} {
		swh, pods := benchResource(n)
		pass := map[string]map[int]portrule.State{}
		for _, p := range pods {
			pass[p.Name] = map[int]portrule.State{0: portrule.Pass, 1: portrule.Pass, 2: portrule.Pass, 3: portrule.Pass}
		}
		results := results(swh, pods, pass)
		written := asExisting(Decide(Observed{Resource: swh, Node: testNode, Zone: "zone-a", Pods: pods, Results: results}).Desired)
		changed := make(scheduler.Results, len(results))
		for uid, rs := range results {
			rs = slices.Clone(rs)
			for i := range rs {
				if uid == pods[0].UID && rs[i].Key.Probe == 1 {
					rs[i].Result = portrule.ProbeResult{State: portrule.Fail, Reason: "connection refused"}
				}
			}
			changed[uid] = rs
		}
		for name, r := range map[string]scheduler.Results{"steady": results, "one-change": changed} {
			o := Observed{Resource: swh, Node: testNode, Zone: "zone-a", Pods: pods, Slices: written, Results: r}
			if d := Decide(o); name == "steady" && d.Plan.HasChanges() {
				b.Fatalf("the steady state plans writes: %+v", d.Plan)
			}
			b.Run(fmt.Sprintf("pods=%d/%s", n, name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					_ = Decide(o)
				}
			})
		}
	}
}

// benchResource is a resource with two ports and four probes (one per port, two whole-pod, one
// with a 4 KiB CA certificate to digest) over n pods of this node.
func benchResource(n int) (*v1alpha1.ServiceWithHealthchecks, []*corev1.Pod) {
	ca := string(make([]byte, 4096))
	swh := vm(webProbe, smtpProbe,
		v1alpha1.Probe{Mode: v1alpha1.ProbeModeHTTP, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 1,
			HTTP: &v1alpha1.HTTPProbe{TargetPort: intstr.FromInt32(9000), Path: "/healthz", Scheme: corev1.URISchemeHTTPS, CACert: ca}},
		v1alpha1.Probe{Mode: v1alpha1.ProbeModeTCP, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 1,
			TCP: &v1alpha1.TCPProbe{TargetPort: intstr.FromInt32(9001)}})
	pods := make([]*corev1.Pod, 0, n)
	for i := range n {
		name := "vm-" + strconv.Itoa(i)
		ip := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
		pods = append(pods, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name), Labels: map[string]string{"app": "vm"}},
			Spec: corev1.PodSpec{NodeName: testNode, Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{
				{Name: "web", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
				{Name: "smtp", ContainerPort: 2525, Protocol: corev1.ProtocolTCP},
			}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		})
	}
	return swh, pods
}
