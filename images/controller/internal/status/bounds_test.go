// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package status

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// boundedSpec is a spec at every bound: nothing in it is out of bounds.
func boundedSpec() v1alpha1.ServiceWithHealthchecksSpec {
	return v1alpha1.ServiceWithHealthchecksSpec{
		Ports: []v1alpha1.ServicePort{{Name: "web", Port: 80, AppProtocol: ptr.To("kubernetes.io/h2c")}},
		Healthcheck: &v1alpha1.Healthcheck{PeriodSeconds: 36, Probes: []v1alpha1.Probe{
			{Mode: v1alpha1.ProbeModeTCP, SuccessThreshold: 100, FailureThreshold: 100, TCP: &v1alpha1.TCPProbe{TargetPort: intstr.FromInt32(80)}},
			{Mode: v1alpha1.ProbeModeHTTP, SuccessThreshold: 1, FailureThreshold: 3, HTTP: &v1alpha1.HTTPProbe{
				TargetPort:  intstr.FromInt32(80),
				Path:        "/a%2Fb?q=%zz",
				Scheme:      "HTTPS",
				CACert:      strings.Repeat("A", v1alpha1.MaxCACertLength),
				HTTPHeaders: []v1alpha1.HTTPHeader{{Name: "X-A", Value: strings.Repeat("v", v1alpha1.MaxHTTPHeadersLength-3)}},
			}},
		}},
	}
}

func TestOutOfBounds(t *testing.T) {
	tests := map[string]struct {
		edit func(s *v1alpha1.ServiceWithHealthchecksSpec)
		want []string // each entry is contained in one reported violation, in order
	}{
		"a spec at every bound has nothing out of bounds": {
			edit: func(*v1alpha1.ServiceWithHealthchecksSpec) {},
		},
		"a spec without a healthcheck has nothing out of bounds": {
			edit: func(s *v1alpha1.ServiceWithHealthchecksSpec) { s.Healthcheck = nil },
		},
		"an empty path is the default / and can be sent": {
			edit: func(s *v1alpha1.ServiceWithHealthchecksSpec) { s.Healthcheck.Probes[1].HTTP.Path = "" },
		},
		"an appProtocol that is not a qualified name names the port and what it breaks": {
			edit: func(s *v1alpha1.ServiceWithHealthchecksSpec) { s.Ports[0].AppProtocol = ptr.To("my protocol") },
			want: []string{`spec.ports[0].appProtocol "my protocol" is not a qualified name (an optional DNS subdomain prefix and '/', then at most 63 letters, digits, '-', '_' or '.'): ` +
				"the API server refuses it in a Service and an EndpointSlice, so the Service and the slices of port web cannot be written"},
		},
		"an empty appProtocol is not a qualified name either": {
			edit: func(s *v1alpha1.ServiceWithHealthchecksSpec) { s.Ports[0].AppProtocol = ptr.To("") },
			want: []string{`spec.ports[0].appProtocol "" is not a qualified name`},
		},
		"a probe that needs more than an hour to fail names the product and the bound": {
			edit: func(s *v1alpha1.ServiceWithHealthchecksSpec) { s.Healthcheck.PeriodSeconds = 3600 },
			want: []string{"spec.healthcheck.probes[0] needs 360000 s to change its verdict (healthcheck.periodSeconds 3600 × failureThreshold 100), more than the bound of 3600 s",
				"spec.healthcheck.probes[1] needs 10800 s to change its verdict (healthcheck.periodSeconds 3600 × failureThreshold 3)"},
		},
		"a probe that needs more than an hour to pass names successThreshold": {
			edit: func(s *v1alpha1.ServiceWithHealthchecksSpec) {
				s.Healthcheck.Probes[0].SuccessThreshold, s.Healthcheck.Probes[0].FailureThreshold = 101, 1
			},
			want: []string{"spec.healthcheck.probes[0] needs 3636 s to change its verdict (healthcheck.periodSeconds 36 × successThreshold 101)"},
		},
		"a path with a broken escape says why and that the probe never runs": {
			edit: func(s *v1alpha1.ServiceWithHealthchecksSpec) { s.Healthcheck.Probes[1].HTTP.Path = "/%zz" },
			want: []string{`spec.healthcheck.probes[1].http.path "/%zz" is not a request path the probe can send (invalid URL escape "%zz"): the probe never runs and always fails`},
		},
		"a path with a line break is quoted with the break escaped": {
			edit: func(s *v1alpha1.ServiceWithHealthchecksSpec) { s.Healthcheck.Probes[1].HTTP.Path = "/a\nb" },
			want: []string{`spec.healthcheck.probes[1].http.path "/a\nb" is not a request path the probe can send (net/url: invalid control character in URL)`},
		},
		"a long path is quoted only in part": {
			edit: func(s *v1alpha1.ServiceWithHealthchecksSpec) {
				s.Healthcheck.Probes[1].HTTP.Path = "/%zz" + strings.Repeat("a", 2000)
			},
			want: []string{`http.path "/%zz` + strings.Repeat("a", maxQuotedValue-4) + `"… is not a request path`},
		},
		"a CA certificate one character over the bound": {
			edit: func(s *v1alpha1.ServiceWithHealthchecksSpec) { s.Healthcheck.Probes[1].HTTP.CACert += "A" },
			want: []string{"spec.healthcheck.probes[1].http.caCert has 16385 characters, more than the bound of 16384"},
		},
		"headers one character over the bound together": {
			edit: func(s *v1alpha1.ServiceWithHealthchecksSpec) {
				s.Healthcheck.Probes[1].HTTP.HTTPHeaders = append(s.Healthcheck.Probes[1].HTTP.HTTPHeaders, v1alpha1.HTTPHeader{Name: "B"})
			},
			want: []string{"spec.healthcheck.probes[1].http.httpHeaders hold 8193 characters of names and values, more than the bound of 8192"},
		},
		"characters are counted, not bytes, as the API server does": {
			edit: func(s *v1alpha1.ServiceWithHealthchecksSpec) {
				s.Healthcheck.Probes[1].HTTP.HTTPHeaders[0].Value = strings.Repeat("\u0436", v1alpha1.MaxHTTPHeadersLength-3)
			},
		},
		"a valid TCP dialogue has nothing out of bounds": {
			edit: func(s *v1alpha1.ServiceWithHealthchecksSpec) {
				s.Healthcheck.Probes[0].TCP.Steps = []v1alpha1.TCPStep{{Send: `INFO replication\r\n`}, {Expect: &v1alpha1.TCPExpect{Regex: "role:master"}}}
			},
		},
		"a TCP regex that RE2 refuses, admitted before the rule, says so and that the probe never runs": {
			edit: func(s *v1alpha1.ServiceWithHealthchecksSpec) {
				s.Healthcheck.Probes[0].TCP.Steps = []v1alpha1.TCPStep{{Send: `x`}, {Expect: &v1alpha1.TCPExpect{Regex: "role:(?=master)"}}}
			},
			want: []string{"spec.healthcheck.probes[0].tcp.steps[1].expect.regex is not an RE2 regular expression: error parsing regexp: " +
				"invalid or unsupported Perl syntax: `(?=`: the probe never runs and always fails"},
		},
		"a TCP send with a bad escape": {
			edit: func(s *v1alpha1.ServiceWithHealthchecksSpec) {
				s.Healthcheck.Probes[0].TCP.Steps = []v1alpha1.TCPStep{{Send: `PING\q`}}
			},
			want: []string{`spec.healthcheck.probes[0].tcp.steps[0].send: "\\q" (character 5) is not an escape`},
		},
		"every violation is reported, in spec order": {
			edit: func(s *v1alpha1.ServiceWithHealthchecksSpec) {
				s.Ports[0].AppProtocol = ptr.To("a b")
				s.Healthcheck.Probes[1].HTTP.Path = "/%"
				s.Healthcheck.Probes[1].FailureThreshold = 101
			},
			want: []string{"spec.ports[0].appProtocol", "spec.healthcheck.probes[1] needs 3636 s", "spec.healthcheck.probes[1].http.path"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			spec := boundedSpec()
			tc.edit(&spec)
			got := OutOfBounds(&spec)
			require.Len(t, got, len(tc.want), "violations: %q", got)
			for i, w := range tc.want {
				assert.Contains(t, got[i], w)
			}
		})
	}
}

func TestSpecOutOfBoundsCondition(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	many := boundedSpec()
	for i := range 10 {
		many.Ports = append(many.Ports, v1alpha1.ServicePort{Name: fmt.Sprintf("p%d", i), Port: int32(1000 + i), AppProtocol: ptr.To("bad value")})
	}
	bad := boundedSpec()
	bad.Healthcheck.Probes[1].HTTP.Path = "/%zz"
	tests := map[string]struct {
		spec       v1alpha1.ServiceWithHealthchecksSpec
		status     metav1.ConditionStatus
		reason     string
		contains   []string
		notContain []string
	}{
		"a spec within the bounds": {
			spec: boundedSpec(), status: metav1.ConditionFalse, reason: ReasonWithinBounds,
			contains: []string{"every value of the spec is within the admission bounds"},
		},
		"a spec with a value out of bounds names it and says edits keep working": {
			spec: bad, status: metav1.ConditionTrue, reason: ReasonOutOfBounds,
			contains: []string{"the spec keeps values admitted before today's bounds: spec.healthcheck.probes[1].http.path", "Edits that leave them", "stay admitted"},
		},
		"many violations are listed up to the bound and counted beyond it": {
			spec: many, status: metav1.ConditionTrue, reason: ReasonOutOfBounds,
			contains:   []string{"spec.ports[8].appProtocol", "and 2 more"},
			notContain: []string{"spec.ports[9].appProtocol", "spec.ports[10].appProtocol"},
		},
	}
	compute := func(spec v1alpha1.ServiceWithHealthchecksSpec) v1alpha1.ServiceWithHealthchecksStatus {
		swh := &v1alpha1.ServiceWithHealthchecks{ObjectMeta: metav1.ObjectMeta{Generation: 2}, Spec: spec}
		return Compute(Observed{Resource: swh, ServiceSynced: metav1.Condition{Status: metav1.ConditionTrue, Reason: "Synced"}, Now: now})
	}
	withinReady := meta.FindStatusCondition(compute(boundedSpec()).Conditions, v1alpha1.ConditionReady)
	require.NotNil(t, withinReady)
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			st := compute(tc.spec)
			c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionSpecOutOfBounds)
			require.NotNil(t, c)
			assert.Equal(t, tc.status, c.Status)
			assert.Equal(t, tc.reason, c.Reason)
			assert.Equal(t, int64(2), c.ObservedGeneration)
			for _, s := range tc.contains {
				assert.Contains(t, c.Message, s)
			}
			for _, s := range tc.notContain {
				assert.NotContains(t, c.Message, s)
			}
			ready := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
			require.NotNil(t, ready)
			assert.Equal(t, withinReady.Status, ready.Status, "SpecOutOfBounds does not decide Ready")
			assert.Equal(t, withinReady.Reason, ready.Reason, "SpecOutOfBounds does not decide Ready")
		})
	}
}
