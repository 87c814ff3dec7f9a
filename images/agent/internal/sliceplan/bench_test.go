// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package sliceplan

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
)

// BenchmarkReconcileSteadyState is the pure part of one reconcile of a resource with 4 ports
// and 100 pods on the node, in steady state: the per-port rule, the desired slices and the diff
// against identical existing slices (no write).
func BenchmarkReconcileSteadyState(b *testing.B) {
	res := resourceWithProbe(webPort, smtpPort)
	for _, n := range []string{"imap", "pop3"} {
		p := smtpPort
		p.Name = n
		res.Spec.Ports = append(res.Spec.Ports, p)
	}
	var pods []*corev1.Pod
	for i := range 100 {
		p := pod(fmt.Sprintf("p%d", i), 8080, fmt.Sprintf("10.0.%d.%d", i/250, i%250+1))
		p.UID = types.UID(fmt.Sprintf("uid-%d", i))
		pods = append(pods, p)
	}
	results := portrule.Results{0: {State: portrule.Pass}}
	first := Compute(Input{Resource: res, Node: node, Pods: evaluated(res, results, pods...)})
	existing := map[string]*discoveryv1.EndpointSlice{}
	var own []*discoveryv1.EndpointSlice
	for _, d := range first {
		s := d.Slice.DeepCopy()
		existing[s.Name] = s
		own = append(own, s)
	}
	b.ReportAllocs()
	for b.Loop() {
		ev := make([]Pod, 0, len(pods))
		for _, p := range pods {
			ev = append(ev, Pod{Pod: p, Endpoints: portrule.Evaluate(&res.Spec, p, results)})
		}
		desired := Compute(Input{Resource: res, Node: node, Pods: ev, Existing: own})
		if Diff(res.Name, res.UID, node, desired, existing).HasChanges() {
			b.Fatal("steady state must not write")
		}
	}
}
