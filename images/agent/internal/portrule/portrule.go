// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package portrule is DESIGN §3, the per-port rule, as one pure function: from a resource's
// spec, one pod and the results of that pod's probes to the endpoint conditions of the pod on
// every Service port.
package portrule

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/podport"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// State is the thresholded result of one probe of one pod.
type State int

// The states of a probe. Unknown means the probe has not reached a decisive result yet (it has
// not run, or it has not failed failureThreshold times nor passed successThreshold times).
const (
	Unknown State = iota
	Pass
	Fail
)

// String names the state.
func (s State) String() string {
	switch s {
	case Pass:
		return "Pass"
	case Fail:
		return "Fail"
	default:
		return "Unknown"
	}
}

// ProbeResult is the current verdict of one probe (by its index in spec.healthcheck.probes).
type ProbeResult struct {
	State State
	// Reason explains a failure, for Events ("connection refused").
	Reason string
	// At is when the run that decided State ended (zero while Unknown, or when not known): the
	// trigger time of the slice write the result causes (Endpoint.Changed).
	At time.Time
}

// Results holds the verdicts of a pod's probes by the probe's index in spec.healthcheck.probes
// (a slice: a reconcile reuses one for every pod). An index past its end is Unknown, as is the
// zero value.
type Results []ProbeResult

// Of is the result of the probe of index i.
func (r Results) Of(i int) ProbeResult {
	if i < 0 || i >= len(r) {
		return ProbeResult{}
	}
	return r[i]
}

// Endpoint is the pod on one Service port.
type Endpoint struct {
	// PortIndex is the index of the Service port in spec.ports, or NoPort for the one endpoint
	// of a pod of a resource without ports (a headless resource may have none).
	PortIndex int
	// Published is false when the pod is not published on this port at all (no IP, not
	// running, terminal, or the pod lacks the named target port).
	Published bool
	// TargetPort is the resolved target port on the pod: where traffic goes.
	TargetPort int32
	// Ready, Serving and Terminating are the EndpointSlice conditions, always explicit.
	Ready, Serving, Terminating bool
	// Decided is false while a probe that checks this port has no decisive result yet and none
	// has failed: the publisher then keeps what an earlier agent published (DESIGN §5).
	Decided bool
	// PublishNotReady tells that the resource publishes not-ready addresses (Ready is forced).
	PublishNotReady bool
	// Drained tells that the pod is drained from this port (rule 8, ApplyDrain): Ready is
	// false whatever the verdict, also an undecided one carried over.
	Drained bool
	// Reason says why the port is not serving ("" when it is), for Events.
	Reason string
	// Changed is when the verdict was decided: the end of the run of the probe that decided it
	// (the last of the passing probes, the first of the failing ones), the pod's Ready
	// transition for a port no probe checks, or the pod's deletion when later. Zero when not
	// known. The agent stamps its slice writes with it (sliceplan.StampTriggers).
	Changed time.Time
	// Probes are the indexes of the probes that check this port (own and whole-pod).
	Probes []int
}

// NoPort is the PortIndex of the endpoint of a resource without ports: the pod itself, checked
// by every probe (all are whole-pod), published in port-less slices as the built-in controller
// publishes a headless Service without ports.
const NoPort = -1

// Conditions returns (ready, serving, terminating) for a serving verdict, the same way
// Evaluate derives them, so a verdict carried over from an earlier agent is turned into
// conditions by the same rule.
func Conditions(serving, terminating, publishNotReady bool) (bool, bool, bool) {
	ready := serving && !terminating
	if publishNotReady {
		ready = true
	}
	return ready, serving, terminating
}

// ResolvePort resolves a target port on a pod: a number is itself, a name is looked up in the
// pod's container ports (for the protocol). ok is false when the pod has no container port of
// that name, or when target is empty (callers pass ServicePort.EffectiveTargetPort, which is
// never empty).
func ResolvePort(pod *corev1.Pod, target intstr.IntOrString, protocol corev1.Protocol) (int32, bool) {
	return podport.Resolve(pod, target, protocol)
}

// Publishable tells whether a pod may be published at all. Pods without an IP, in a terminal
// phase, or not Running are never published, except that publishNotReadyAddresses publishes
// every non-terminal pod with an IP, like a Service. It is the one rule for both publishing and
// probing: a pod that cannot be published is not probed.
func Publishable(pod *corev1.Pod, publishNotReady bool) bool {
	if PrimaryAddress(pod) == "" {
		return false
	}
	switch pod.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed:
		return false
	case corev1.PodRunning:
		return true
	default:
		return publishNotReady
	}
}

// PrimaryAddress is the address probes dial: status.podIP, or the first of status.podIPs when
// podIP is not set ("" when the pod has no address). The kubelet probes the primary address
// too; the verdict covers every address family of the pod.
func PrimaryAddress(pod *corev1.Pod) string {
	if pod.Status.PodIP != "" {
		return pod.Status.PodIP
	}
	for _, ip := range pod.Status.PodIPs {
		if ip.IP != "" {
			return ip.IP
		}
	}
	return ""
}

// PodReady is the pod's Ready condition.
func PodReady(pod *corev1.Pod) bool {
	ready, _ := podReady(pod)
	return ready
}

// podReady is the pod's Ready condition and when it last changed (zero when not known).
func podReady(pod *corev1.Pod) (bool, time.Time) {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue, c.LastTransitionTime.Time
		}
	}
	return false, time.Time{}
}

// deletedAt is when the pod's deletion was asked for: its deletionTimestamp less its grace
// period (zero when it is not terminating).
func deletedAt(pod *corev1.Pod) time.Time {
	if pod.DeletionTimestamp == nil {
		return time.Time{}
	}
	t := pod.DeletionTimestamp.Time
	if g := pod.DeletionGracePeriodSeconds; g != nil && *g > 0 {
		t = t.Add(-time.Duration(*g) * time.Second)
	}
	return t
}

// Binding is where a resource's Service ports and probes land on one pod (rules 1 to 3): the
// resolved target port of every Service port, the port of every probe, and which Service ports
// each probe checks. It is computed once per pod and reconcile and feeds both the scheduler
// (which probes run, on which port: Targets) and the verdicts (Evaluate).
type Binding struct {
	// Publishable is Publishable(pod, publishNotReadyAddresses): the pod is published and
	// probed only then.
	Publishable bool
	// Terminating is set when the pod has a deletionTimestamp.
	Terminating bool
	// PodReady is the pod's Ready condition, which unprobed ports follow (rule 4), and
	// PodReadySince when it last changed.
	PodReady      bool
	PodReadySince time.Time
	// DeletedAt is when the pod's deletion was asked for (zero when it is not terminating).
	DeletedAt time.Time
	// Address is the pod's primary address, which probes dial.
	Address string
	// Ports has one entry per spec.ports entry, in order.
	Ports []PortBinding
	// Probes has one entry per spec.healthcheck.probes entry, in order.
	Probes []ProbeBinding
	// WholePod lists, by index, the probes that check the pod as a whole (rule 3).
	WholePod []int
}

// PortBinding is one Service port on the pod.
type PortBinding struct {
	// TargetPort is the resolved target port: where traffic goes (0 when not Resolved).
	TargetPort int32
	// Resolved is false when the pod lacks the named target port: it is not published there.
	Resolved bool
	// Probes lists, by index, the probes of this port's own (rule 2); the whole-pod probes
	// check it too.
	Probes []int
	// Checked lists every probe that checks this port: Probes, then the whole-pod probes.
	Checked []int
}

// ProbeBinding is one probe on the pod.
type ProbeBinding struct {
	// Port is the probe's target port resolved on the pod (0 when not Runnable).
	Port int32
	// Runnable is false when the pod lacks the probe's named port: the probe cannot run there
	// and counts as failed for the ports it checks.
	Runnable bool
	// Ports lists, by index, the Service ports this probe checks; empty for a whole-pod probe.
	Ports []int
}

// Bind resolves the ports and probes of spec on pod (rules 1 to 3).
func Bind(spec *v1alpha1.ServiceWithHealthchecksSpec, pod *corev1.Pod) Binding {
	var bd Binder
	return bd.Bind(spec, pod)
}

// Binder binds the pods of one reconcile out of shared buffers: three allocations per pod
// become three per reconcile (NewBinder). A Binding stays valid after the next Bind: a buffer
// that runs out is replaced, never grown in place.
type Binder struct {
	ports  []PortBinding
	probes []ProbeBinding
	arena  []int
}

// NewBinder returns a Binder with room for n pods of spec.
func NewBinder(spec *v1alpha1.ServiceWithHealthchecksSpec, n int) *Binder {
	bd := &Binder{ports: make([]PortBinding, 0, n*len(spec.Ports))}
	if spec.Healthcheck != nil {
		probes := len(spec.Healthcheck.Probes)
		bd.probes = make([]ProbeBinding, 0, n*probes)
		bd.arena = make([]int, 0, n*arenaSize(spec))
	}
	return bd
}

// arenaSize bounds the index lists of one pod's binding.
func arenaSize(spec *v1alpha1.ServiceWithHealthchecksSpec) int {
	probes := len(spec.Healthcheck.Probes)
	return 3*probes*len(spec.Ports) + probes
}

// take cuts n zeroed elements off the end of buf, replacing buf by a new one (room for n, or for
// as many as it had) when it has no room left.
func take[T any](buf *[]T, n int) []T {
	if cap(*buf)-len(*buf) < n {
		*buf = make([]T, 0, max(n, cap(*buf)))
	}
	start := len(*buf)
	*buf = (*buf)[:start+n]
	return (*buf)[start : start+n : start+n]
}

// Bind resolves the ports and probes of spec on pod (rules 1 to 3).
func (bd *Binder) Bind(spec *v1alpha1.ServiceWithHealthchecksSpec, pod *corev1.Pod) Binding {
	b := Binding{
		Publishable: Publishable(pod, spec.PublishNotReadyAddresses),
		Terminating: pod.DeletionTimestamp != nil,
		Address:     PrimaryAddress(pod),
		DeletedAt:   deletedAt(pod),
		Ports:       take(&bd.ports, len(spec.Ports)),
	}
	b.PodReady, b.PodReadySince = podReady(pod)
	// Rule 1: the resolved target port of every Service port.
	for i, sp := range spec.Ports {
		n, ok := ResolvePort(pod, sp.EffectiveTargetPort(), sp.Protocol)
		b.Ports[i] = PortBinding{TargetPort: n, Resolved: ok}
	}
	if spec.Healthcheck == nil {
		return b
	}
	// Rules 2 and 3: which ports each probe checks. A probe whose named port the pod lacks
	// cannot run: it belongs to the Service ports with the same named target port (which are
	// unpublished on this pod anyway) or, when there are none, fails the pod as a whole.
	probes := spec.Healthcheck.Probes
	b.Probes = take(&bd.probes, len(probes))
	// The index lists share one backing array: each probe's list of ports is cut from it, then
	// the whole-pod list, then each port's own probes and the probes that check it.
	arena := take(&bd.arena, arenaSize(spec))[:0]
	for pi, p := range probes {
		t := p.TargetPort()
		n, ok := ResolvePort(pod, t, corev1.ProtocolTCP)
		pb := ProbeBinding{Port: n, Runnable: ok}
		start := len(arena)
		for i, sp := range spec.Ports {
			switch {
			case ok && b.Ports[i].Resolved && b.Ports[i].TargetPort == n:
				arena = append(arena, i)
			case !ok && t.Type == intstr.String && sp.TargetPort.Type == intstr.String && sp.TargetPort.StrVal == t.StrVal:
				arena = append(arena, i)
			}
		}
		if len(arena) > start {
			pb.Ports = arena[start:len(arena):len(arena)]
		}
		b.Probes[pi] = pb
	}
	start := len(arena)
	for pi := range b.Probes {
		if len(b.Probes[pi].Ports) == 0 {
			arena = append(arena, pi)
		}
	}
	if len(arena) > start {
		b.WholePod = arena[start:len(arena):len(arena)]
	}
	for i := range b.Ports {
		start := len(arena)
		for pi := range b.Probes {
			if slices.Contains(b.Probes[pi].Ports, i) {
				arena = append(arena, pi)
			}
		}
		if len(arena) > start {
			b.Ports[i].Probes = arena[start:len(arena):len(arena)]
		}
		switch {
		case len(b.WholePod) == 0:
			b.Ports[i].Checked = b.Ports[i].Probes
		case len(b.Ports[i].Probes) == 0:
			b.Ports[i].Checked = b.WholePod
		default:
			start = len(arena)
			arena = append(append(arena, b.Ports[i].Probes...), b.WholePod...)
			b.Ports[i].Checked = arena[start:len(arena):len(arena)]
		}
	}
	return b
}

// Evaluate applies the per-port rule to one pod: Bind, then Binding.Evaluate.
func Evaluate(spec *v1alpha1.ServiceWithHealthchecksSpec, pod *corev1.Pod, results Results) []Endpoint {
	return Bind(spec, pod).Evaluate(spec, results)
}

// Evaluate returns the pod's Endpoint on every Service port of spec, in order, from the
// thresholded results of its probes (rules 4 to 7).
func (b Binding) Evaluate(spec *v1alpha1.ServiceWithHealthchecksSpec, results Results) []Endpoint {
	return b.AppendEvaluate(nil, spec, results)
}

// AppendEvaluate is Evaluate appending to dst and returning the extended slice, so that one
// buffer can hold the endpoints of every pod of a reconcile (one allocation instead of one per
// pod). The pod's endpoints are the returned slice's last entries, one per port.
func (b Binding) AppendEvaluate(dst []Endpoint, spec *v1alpha1.ServiceWithHealthchecksSpec, results Results) []Endpoint {
	var probes []v1alpha1.Probe
	if spec.Healthcheck != nil {
		probes = spec.Healthcheck.Probes
	}
	ports := b.Ports
	index := func(i int) int { return i }
	if len(spec.Ports) == 0 {
		// No ports: the pod as a whole, which only the whole-pod probes (all of them) check.
		ports = []PortBinding{{Resolved: true}}
		index = func(int) int { return NoPort }
	}
	first := len(dst)
	dst = slices.Grow(dst, len(ports))[:first+len(ports)]
	out := dst[first:]
	for i, pb := range ports {
		e := &out[i]
		*e = Endpoint{}
		e.PortIndex = index(i)
		e.PublishNotReady = spec.PublishNotReadyAddresses
		e.TargetPort = pb.TargetPort
		e.Published = pb.Resolved && b.Publishable
		if !e.Published {
			continue
		}
		e.Terminating = b.Terminating
		// Shared with the binding: the endpoint does not change it.
		e.Probes = pb.Checked
		if len(spec.Ports) == 0 {
			e.Probes = b.WholePod
		}
		var serving bool
		if len(e.Probes) == 0 {
			// Rule 4, second half: an unprobed port follows the pod's Ready condition.
			serving, e.Decided, e.Changed = b.PodReady, true, b.PodReadySince
			if !b.PodReady {
				e.Reason = "pod is not Ready"
			}
		} else {
			// Rules 4 and 5: every probe that checks the port must pass; pod readiness is
			// not consulted.
			serving, e.Decided, e.Reason, e.Changed = b.verdict(e.Probes, probes, results)
		}
		if b.DeletedAt.After(e.Changed) {
			e.Changed = b.DeletedAt
		}
		e.Ready, e.Serving, e.Terminating = Conditions(serving, b.Terminating, spec.PublishNotReadyAddresses)
	}
	return dst
}

// verdict combines the probes that check a port: any failure fails it (decided), all passing
// passes it (decided), otherwise it is undecided and not serving. It also says when the
// verdict was decided: by the first of the failing probes, or the last of the passing ones.
func (b Binding) verdict(idx []int, probes []v1alpha1.Probe, results Results) (bool, bool, string, time.Time) {
	var reasons []string
	unknown := false
	var firstFail, lastPass time.Time
	for _, pi := range idx {
		if !b.Probes[pi].Runnable {
			reasons = append(reasons, fmt.Sprintf("probe %d (%s): pod has no container port named %q", pi, probes[pi].Mode, probes[pi].TargetPort().StrVal))
			continue
		}
		r := results.Of(pi)
		switch r.State {
		case Fail:
			reasons = append(reasons, fmt.Sprintf("probe %d (%s): %s", pi, probes[pi].Mode, r.Reason))
			if !r.At.IsZero() && (firstFail.IsZero() || r.At.Before(firstFail)) {
				firstFail = r.At
			}
		case Pass:
			if r.At.After(lastPass) {
				lastPass = r.At
			}
		case Unknown:
			unknown = true
		}
	}
	if len(reasons) > 0 {
		return false, true, strings.Join(reasons, "; "), firstFail
	}
	if unknown {
		return false, false, "waiting for a decisive probe result", time.Time{}
	}
	return true, true, "", lastPass
}
