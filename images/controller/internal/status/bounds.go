// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package status

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// Reasons of the SpecOutOfBounds condition.
const (
	// ReasonWithinBounds: every value of the spec meets today's admission bounds.
	ReasonWithinBounds = "WithinBounds"
	// ReasonOutOfBounds: the spec keeps values admitted before today's bounds existed.
	ReasonOutOfBounds = "OutOfBounds"
)

// maxNamedViolations bounds the violations a SpecOutOfBounds message lists.
const maxNamedViolations = 8

// maxQuotedValue bounds how much of an offending value a message quotes.
const maxQuotedValue = 64

// OutOfBounds lists, in spec order, the values of spec that the CRD's input bounds (issue 16
// part 5) refuse today. The API server admitted them before those bounds existed and keeps them
// on updates that leave them unchanged (CRD validation ratcheting), so only the status can say
// what is wrong. Each entry names the field, the bound and what the value does meanwhile. The
// rules are those of the CRD markers of api/v1alpha1, checked with the oracles testkit/crd
// compares the CRD with: validation.IsQualifiedName (a Service's appProtocol rule) and
// url.ParseRequestURI (how the prober builds its request).
func OutOfBounds(spec *v1alpha1.ServiceWithHealthchecksSpec) []string {
	var out []string
	for i, p := range spec.Ports {
		if p.AppProtocol != nil && len(validation.IsQualifiedName(*p.AppProtocol)) > 0 {
			out = append(out, fmt.Sprintf("spec.ports[%d].appProtocol %s is not a qualified name (an optional DNS subdomain prefix and '/', "+
				"then at most 63 letters, digits, '-', '_' or '.'): the API server refuses it in a Service and an EndpointSlice, "+
				"so the Service and the slices of port %s cannot be written", i, quoted(*p.AppProtocol), p.DisplayName()))
		}
	}
	hc := spec.Healthcheck
	if hc == nil {
		return out
	}
	for i := range hc.Probes {
		p := &hc.Probes[i]
		field := fmt.Sprintf("spec.healthcheck.probes[%d]", i)
		threshold, name := p.FailureThreshold, "failureThreshold"
		if p.SuccessThreshold > p.FailureThreshold {
			threshold, name = p.SuccessThreshold, "successThreshold"
		}
		if seconds := int64(hc.PeriodSeconds) * int64(threshold); seconds > v1alpha1.MaxDecisionSeconds {
			out = append(out, fmt.Sprintf("%s needs %d s to change its verdict (healthcheck.periodSeconds %d × %s %d), more than the bound of %d s",
				field, seconds, hc.PeriodSeconds, name, threshold, v1alpha1.MaxDecisionSeconds))
		}
		if p.TCP != nil {
			for _, err := range v1alpha1.CheckTCPSteps(p.TCP.Steps) {
				out = append(out, fmt.Sprintf("%s.tcp.%s: the probe never runs and always fails", field, err))
			}
		}
		if p.HTTP == nil {
			continue
		}
		path := p.HTTP.Path
		if path == "" {
			path = "/" // the API server's default, which the prober applies too
		}
		if _, err := url.ParseRequestURI(path); err != nil {
			out = append(out, fmt.Sprintf("%s.http.path %s is not a request path the probe can send (%s): the probe never runs and always fails",
				field, quoted(p.HTTP.Path), parseReason(err)))
		}
		if n := utf8.RuneCountInString(p.HTTP.CACert); n > v1alpha1.MaxCACertLength {
			out = append(out, fmt.Sprintf("%s.http.caCert has %d characters, more than the bound of %d", field, n, v1alpha1.MaxCACertLength))
		}
		total := 0
		for _, h := range p.HTTP.HTTPHeaders {
			total += utf8.RuneCountInString(h.Name) + utf8.RuneCountInString(h.Value)
		}
		if total > v1alpha1.MaxHTTPHeadersLength {
			out = append(out, fmt.Sprintf("%s.http.httpHeaders hold %d characters of names and values, more than the bound of %d",
				field, total, v1alpha1.MaxHTTPHeadersLength))
		}
	}
	return out
}

// specOutOfBounds is the SpecOutOfBounds condition of spec.
func specOutOfBounds(spec *v1alpha1.ServiceWithHealthchecksSpec) metav1.Condition {
	found := OutOfBounds(spec)
	if len(found) == 0 {
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonWithinBounds,
			Message: "every value of the spec is within the admission bounds"}
	}
	listed := found
	if len(listed) > maxNamedViolations {
		listed = append(listed[:maxNamedViolations:maxNamedViolations], fmt.Sprintf("and %d more", len(found)-maxNamedViolations))
	}
	return metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonOutOfBounds, Message: "the spec keeps values admitted before today's bounds: " +
		strings.Join(listed, "; ") +
		". Edits that leave them and the parts holding them unchanged stay admitted (a change to that port, or to spec.healthcheck, re-checks them); fix them to meet the bounds"}
}

// quoted quotes a value for a message (control characters escaped), cut to maxQuotedValue.
func quoted(s string) string {
	if utf8.RuneCountInString(s) <= maxQuotedValue {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q…", string([]rune(s)[:maxQuotedValue]))
}

// parseReason is what url.ParseRequestURI found wrong, without its quoting of the whole value.
func parseReason(err error) string {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return ue.Err.Error()
	}
	return err.Error()
}
