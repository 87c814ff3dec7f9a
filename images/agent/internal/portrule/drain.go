// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package portrule

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// ReasonDrained is the reason of a port out of new connections because its pod is drained
// (rule 8): the Events' and the resource status' word for it.
const ReasonDrained = "drained by annotation " + wellknown.AnnotationDrain

// maxDrainEntries bounds the entries of a drain annotation that are read; the rest is reported.
const maxDrainEntries = 64

// Drain is a pod's drain annotation (wellknown.AnnotationDrain), parsed: which resources, and
// which of their ports, the pod is drained from. The zero value drains nothing.
type Drain struct {
	// All is set by "*": every resource, every port.
	All bool
	// Entries are the valid entries of a list, in order.
	Entries []DrainEntry
}

// DrainEntry is one entry of a drain list: a resource and one of its ports by name (or number
// when unnamed), or "" for every port.
type DrainEntry struct {
	Resource, Port string
}

// String is the entry as written.
func (e DrainEntry) String() string {
	if e.Port == "" {
		return e.Resource
	}
	return e.Resource + "/" + e.Port
}

// DrainOf parses the drain annotation of a pod (no annotation: no drain). See ParseDrain.
func DrainOf(pod *corev1.Pod) (Drain, []string) {
	v, ok := pod.Annotations[wellknown.AnnotationDrain]
	if !ok {
		return Drain{}, nil
	}
	return ParseDrain(v)
}

// ParseDrain parses a drain annotation's value: "*", or a comma-separated list of "resource"
// and "resource/port" entries (spaces around entries are ignored). It never fails as a whole:
// the valid entries are kept and every invalid one is described in problems, for an Event on
// the pod (an operator's typo in one entry does not undo the others).
func ParseDrain(value string) (d Drain, problems []string) {
	v := strings.TrimSpace(value)
	if v == "" {
		return Drain{}, []string{`the value is empty: write "*" to drain the pod from every resource, or a comma-separated list of resource or resource/port names`}
	}
	if v == wellknown.DrainAll {
		return Drain{All: true}, nil
	}
	for i, raw := range strings.Split(v, ",") {
		if i == maxDrainEntries {
			problems = append(problems, fmt.Sprintf("more than %d entries: the rest is ignored", maxDrainEntries))
			break
		}
		e, problem := parseDrainEntry(strings.TrimSpace(raw))
		if problem != "" {
			problems = append(problems, problem)
			continue
		}
		d.Entries = append(d.Entries, e)
	}
	return d, problems
}

// parseDrainEntry parses one entry of a drain list; problem describes an invalid one.
func parseDrainEntry(s string) (DrainEntry, string) {
	switch s {
	case "":
		return DrainEntry{}, "an empty entry (two commas, or a comma at an end)"
	case wellknown.DrainAll:
		return DrainEntry{}, `"*" must stand alone, not in a list`
	}
	res, port, hasPort := strings.Cut(s, "/")
	if errs := validation.IsDNS1035Label(res); len(errs) > 0 {
		return DrainEntry{}, fmt.Sprintf("%q: %q is not a resource name (%s)", s, res, strings.Join(errs, "; "))
	}
	if !hasPort {
		return DrainEntry{Resource: res}, ""
	}
	if port == "" {
		return DrainEntry{}, fmt.Sprintf("%q: no port after the slash (write %q for every port)", s, res)
	}
	if n, err := strconv.Atoi(port); err == nil {
		if errs := validation.IsValidPortNum(n); len(errs) > 0 {
			return DrainEntry{}, fmt.Sprintf("%q: %s", s, strings.Join(errs, "; "))
		}
		return DrainEntry{Resource: res, Port: strconv.Itoa(n)}, ""
	}
	if errs := validation.IsValidPortName(port); len(errs) > 0 {
		return DrainEntry{}, fmt.Sprintf("%q: %q is not a port name (%s)", s, port, strings.Join(errs, "; "))
	}
	return DrainEntry{Resource: res, Port: port}, ""
}

// Any tells whether the drain names anything.
func (d Drain) Any() bool { return d.All || len(d.Entries) > 0 }

// Covers tells whether the drain takes the pod out of the port of index i of the resource named
// resource (NoPort: the pod as a whole, of a resource without ports). A port is named by its
// name, or by its number when it has none.
func (d Drain) Covers(resource string, spec *v1alpha1.ServiceWithHealthchecksSpec, i int) bool {
	if d.All {
		return true
	}
	for _, e := range d.Entries {
		if e.Resource != resource {
			continue
		}
		if e.Port == "" {
			return true
		}
		if i >= 0 && i < len(spec.Ports) && spec.Ports[i].DisplayName() == e.Port {
			return true
		}
	}
	return false
}

// Unknown describes the entries that name no resource of ports (the resources of the pod's
// namespace, with their ports), or no port of the resource they name. Entries that name another
// resource than the one a reconcile decides are simply not its own; only an entry that names
// none of the namespace's is a mistake.
func (d Drain) Unknown(ports map[string][]v1alpha1.ServicePort) []string {
	var out []string
	for _, e := range d.Entries {
		sps, ok := ports[e.Resource]
		if !ok {
			out = append(out, fmt.Sprintf("%q: no ServiceWithHealthchecks %q in the pod's namespace", e.String(), e.Resource))
			continue
		}
		if e.Port == "" {
			continue
		}
		found := false
		for _, sp := range sps {
			found = found || sp.DisplayName() == e.Port
		}
		if !found {
			out = append(out, fmt.Sprintf("%q: ServiceWithHealthchecks %q has no port %q", e.String(), e.Resource, e.Port))
		}
	}
	return out
}

// ApplyDrain is rule 8: the published endpoints of a pod (its window of AppendEvaluate's
// result) on the ports the drain covers are taken out of new connections: ready=false, also
// when the resource publishes not-ready addresses (an operator's explicit drain of one pod wins
// over the resource-wide setting), serving as the probes decide. Terminating stays the pod's
// own state here (the agent's Events tell a drain from a pod's deletion by it); sliceplan
// publishes a drained endpoint with terminating=true, the triple every dataplane reads as "no
// new connections, established ones kept".
func ApplyDrain(eps []Endpoint, resource string, spec *v1alpha1.ServiceWithHealthchecksSpec, d Drain) {
	if !d.Any() {
		return
	}
	for i := range eps {
		e := &eps[i]
		if !e.Published || !d.Covers(resource, spec, e.PortIndex) {
			continue
		}
		e.Drained = true
		e.Ready = false
	}
}
