// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package version

import (
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestLine(t *testing.T) {
	for _, tc := range []struct {
		name, version, revision, want string
	}{
		{"unstamped", "dev", "unknown", "agent dev (revision unknown, " + runtime.Version() + ")\n"},
		{"stamped", "0.2.0", "6c6bd7e", "agent 0.2.0 (revision 6c6bd7e, " + runtime.Version() + ")\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			oldVersion, oldRevision := Version, Revision
			t.Cleanup(func() { Version, Revision = oldVersion, oldRevision })
			Version, Revision = tc.version, tc.revision
			if got := Line("agent"); got != tc.want {
				t.Errorf("Line = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestBuildInfoIsOneSeriesOfValueOneWithTheBuildLabels(t *testing.T) {
	oldVersion, oldRevision := Version, Revision
	t.Cleanup(func() { Version, Revision = oldVersion, oldRevision })
	Version, Revision = "0.2.0", "0123abc"
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(BuildInfo("swh_test_build_info"))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(families) != 1 || families[0].GetName() != "swh_test_build_info" || len(families[0].GetMetric()) != 1 {
		t.Fatalf("want one family swh_test_build_info with one series, got %v", families)
	}
	m := families[0].GetMetric()[0]
	if got := m.GetGauge().GetValue(); got != 1 {
		t.Errorf("value = %v, want 1", got)
	}
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	want := map[string]string{"version": "0.2.0", "revision": "0123abc", "goversion": runtime.Version()}
	if len(labels) != len(want) {
		t.Errorf("labels = %v, want %v", labels, want)
	}
	for k, v := range want {
		if labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, labels[k], v)
		}
	}
}
