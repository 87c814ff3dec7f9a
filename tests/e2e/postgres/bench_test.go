// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package postgres_test

import (
	"slices"
	"testing"
	"time"
)

// BenchmarkDBWriteSwitch runs scenario 1 once per iteration, each on fresh databases in a fresh
// namespace of the shared stack, and reports the median of the measured times in seconds:
// switch-s (old primary stopped → every new connection reaches the new primary), routed-s
// (→ kube-proxy routes only to the new primary) and bound-s (the decision bound, for
// comparison). ns/op is the whole scenario (starting PostgreSQL, the examples' initial delay),
// not a figure of the product. Run it with a fixed count of iterations:
//
//	cd tests && go test ./e2e/postgres/ -run '^$' -bench DBWriteSwitch -benchtime 5x
func BenchmarkDBWriteSwitch(b *testing.B) {
	s := testStack(b)
	var switches, routed []time.Duration
	var bound time.Duration
	for b.Loop() {
		m := failoverDBWrite(b, s)
		switches = append(switches, m.Switch)
		routed = append(routed, m.Routed)
		bound = m.Bound
	}
	b.ReportMetric(median(switches).Seconds(), "switch-s")
	b.ReportMetric(median(routed).Seconds(), "routed-s")
	b.ReportMetric(bound.Seconds(), "bound-s")
	b.Logf("switch times: %v (median %v), kube-proxy: %v (median %v), bound %v", switches, median(switches), routed, median(routed), bound)
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
