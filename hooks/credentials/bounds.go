// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package credentials

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// The bounds of what the hook writes into the module's values (issue 40): the values are
// rendered into the module's Helm release, which every tenant shares, so one tenant with many
// resources and long names must not push it past what Helm can store. What does not fit is
// reported, on the resources too (OverLimitEvents), never dropped silently.
const (
	// MaxSecretsPerNamespace bounds the credential Secrets of one namespace the agent may read.
	MaxSecretsPerNamespace = 64
	// MaxSecrets bounds them in all: names of at most 253 characters, about 260 KiB of values.
	MaxSecrets = 1000
	// MaxProblems bounds the problems listed in the values; the rest are counted in the log
	// and, for OverLimit, in MetricOverLimit.
	MaxProblems = 100
	// MaxReferencedBy bounds the resources a problem lists; the rest are counted
	// (Problem.ReferencedByMore).
	MaxReferencedBy = 10
	// MaxEvents bounds the Events one run of the hook writes (one per resource that references
	// a Secret over the bounds).
	MaxEvents = 100

	// ProblemOverLimit: the Secret exists and is referenced, but its namespace (or the cluster)
	// has more referenced credential Secrets than the values hold: the agent may not read it.
	ProblemOverLimit = "OverLimit"
	// MetricOverLimit counts, per namespace, the referenced credential Secrets over the bounds.
	MetricOverLimit = "d8_service_with_healthchecks_credential_secrets_over_limit"
	// EventReasonOverLimit is the reason of the Event on a resource that references a Secret
	// over the bounds.
	EventReasonOverLimit = "CredentialSecretsOverLimit"
	// eventController is the reportingController of the hook's Events.
	eventController = "service-with-healthchecks.network.deckhouse.io/credentials-hook"
	// maxNoteBytes is the longest Event note the events API accepts.
	maxNoteBytes = 1024
)

// now is the clock of the Events' eventTime (tests replace it).
var now = time.Now

// boundReadable keeps at most MaxSecretsPerNamespace names of each namespace and MaxSecrets in
// all, filled fairly: round by round, one more name of every namespace that has one (names and
// namespaces in order, so the result is stable), until the total is reached. It returns the
// names kept and those left out.
func boundReadable(byNamespace map[string][]string) (map[string][]string, []secretKey) {
	namespaces := make([]string, 0, len(byNamespace))
	for ns, names := range byNamespace {
		sort.Strings(names)
		namespaces = append(namespaces, ns)
	}
	sort.Strings(namespaces)
	kept := make(map[string][]string, len(byNamespace))
	total := 0
	for round := 0; round < MaxSecretsPerNamespace && total < MaxSecrets; round++ {
		for _, ns := range namespaces {
			if round < len(byNamespace[ns]) && total < MaxSecrets {
				kept[ns] = append(kept[ns], byNamespace[ns][round])
				total++
			}
		}
	}
	var over []secretKey
	for _, ns := range namespaces {
		for _, name := range byNamespace[ns][len(kept[ns]):] {
			over = append(over, secretKey{namespace: ns, name: name})
		}
	}
	return kept, over
}

// compactRefs are the resources of namespace that reference the Secret name, whatever type
// their probes need, sorted and unique.
func compactRefs(referencedBy map[secretKey][]string, namespace, name string) []string {
	var refs []string
	for k, r := range referencedBy {
		if k.namespace == namespace && k.name == name {
			refs = append(refs, r...)
		}
	}
	sort.Strings(refs)
	return slices.Compact(refs)
}

// omittedProblems counts the problems BoundProblems left out, in all and OverLimit ones by
// namespace.
type omittedProblems struct {
	total     int
	overLimit map[string]int
}

// BoundProblems keeps the first MaxProblems problems (they are sorted) and at most
// MaxReferencedBy resources of each, counting the rest.
func BoundProblems(problems []Problem) ([]Problem, omittedProblems) {
	omitted := omittedProblems{overLimit: map[string]int{}}
	if len(problems) > MaxProblems {
		for _, p := range problems[MaxProblems:] {
			omitted.total++
			if p.Kind == ProblemOverLimit {
				omitted.overLimit[p.Namespace]++
			}
		}
		problems = problems[:MaxProblems]
	}
	for i := range problems {
		if n := len(problems[i].ReferencedBy); n > MaxReferencedBy {
			problems[i].ReferencedByMore = n - MaxReferencedBy
			problems[i].ReferencedBy = problems[i].ReferencedBy[:MaxReferencedBy]
		}
	}
	return problems, omitted
}

// overLimitByNamespace counts the OverLimit problems per namespace, listed or not.
func overLimitByNamespace(listed []Problem, omitted omittedProblems) map[string]int {
	out := map[string]int{}
	for _, p := range listed {
		if p.Kind == ProblemOverLimit {
			out[p.Namespace]++
		}
	}
	for ns, n := range omitted.overLimit {
		out[ns] += n
	}
	return out
}

// OverLimitEvents are the Events (events.k8s.io/v1, as unstructured maps) on the resources that
// reference a Secret over the bounds: one per resource, at most MaxEvents, named after the
// resource so that every run of the hook updates the same Event. The note names the Secrets
// (as many as fit in 1 KiB) and the bounds.
func OverLimitEvents(resources []Resource, problems []Problem, at time.Time) []map[string]any {
	type res struct{ namespace, name string }
	over := map[res][]string{}
	var order []res
	for _, p := range problems {
		if p.Kind != ProblemOverLimit {
			continue
		}
		for _, r := range p.ReferencedBy {
			k := res{p.Namespace, r}
			if _, seen := over[k]; !seen {
				order = append(order, k)
			}
			over[k] = append(over[k], p.Name)
		}
	}
	sort.Slice(order, func(i, j int) bool {
		if order[i].namespace != order[j].namespace {
			return order[i].namespace < order[j].namespace
		}
		return order[i].name < order[j].name
	})
	uids := map[res]string{}
	for _, r := range resources {
		uids[res{r.Namespace, r.Name}] = r.UID
	}
	if len(order) > MaxEvents {
		order = order[:MaxEvents]
	}
	out := make([]map[string]any, 0, len(order))
	for _, k := range order {
		regarding := map[string]any{
			"apiVersion": wellknown.Group + "/v1alpha1", "kind": wellknown.Kind, "namespace": k.namespace, "name": k.name,
		}
		if uid := uids[k]; uid != "" {
			regarding["uid"] = uid
		}
		out = append(out, map[string]any{
			"apiVersion": "events.k8s.io/v1",
			"kind":       "Event",
			"metadata": map[string]any{
				"namespace": k.namespace,
				"name":      k.name + ".credentials-over-limit",
			},
			"eventTime":           at.UTC().Format("2006-01-02T15:04:05.000000Z07:00"),
			"reportingController": eventController,
			"reportingInstance":   "deckhouse",
			"action":              "GrantCredentials",
			"reason":              EventReasonOverLimit,
			"type":                "Warning",
			"regarding":           regarding,
			"note":                overLimitNote(over[k]),
		})
	}
	return out
}

// overLimitNote says which Secrets the agent may not read and why, within maxNoteBytes.
func overLimitNote(names []string) string {
	head := fmt.Sprintf("the agent may not read the credential Secrets of this resource's probes over the module's bounds (%d per namespace, %d in all; the module's values hold their names), so those probes fail: ",
		MaxSecretsPerNamespace, MaxSecrets)
	var b strings.Builder
	b.WriteString(head)
	for i, n := range names {
		part := n
		if i > 0 {
			part = ", " + n
		}
		more := fmt.Sprintf(" and %d more", len(names)-i)
		if b.Len()+len(part)+len(" and 0000 more") > maxNoteBytes {
			b.WriteString(more)
			return b.String()
		}
		b.WriteString(part)
	}
	return b.String()
}
