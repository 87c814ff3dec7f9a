// Package portrule is DESIGN §3, the per-port rule, as one pure function: from a resource's
// spec, one pod and the results of that pod's probes to the endpoint conditions of the pod on
// every Service port.
package portrule

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

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
}

// Results holds the verdicts of a pod's probes, keyed by the probe's index in
// spec.healthcheck.probes. A missing index is Unknown.
type Results map[int]ProbeResult

// Endpoint is the pod on one Service port.
type Endpoint struct {
	// PortIndex is the index of the Service port in spec.ports.
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
	// Reason says why the port is not serving ("" when it is), for Events.
	Reason string
	// Probes are the indexes of the probes that check this port (own and whole-pod).
	Probes []int
}

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
// pod's container ports (for the protocol), and an omitted one equals port. ok is false when
// the pod has no container port of that name.
func ResolvePort(pod *corev1.Pod, target intstr.IntOrString, port int32, protocol corev1.Protocol) (int32, bool) {
	switch {
	case target.Type == intstr.String && target.StrVal != "":
		if protocol == "" {
			protocol = corev1.ProtocolTCP
		}
		for _, c := range pod.Spec.Containers {
			for _, cp := range c.Ports {
				cpProto := cp.Protocol
				if cpProto == "" {
					cpProto = corev1.ProtocolTCP
				}
				if cp.Name == target.StrVal && cpProto == protocol {
					return cp.ContainerPort, true
				}
			}
		}
		return 0, false
	case target.Type == intstr.Int && target.IntVal != 0:
		return target.IntVal, true
	default:
		return port, true
	}
}

// ProbeTarget is the target port of a probe's own block.
func ProbeTarget(p v1alpha1.Probe) intstr.IntOrString {
	switch {
	case p.TCP != nil:
		return p.TCP.TargetPort
	case p.HTTP != nil:
		return p.HTTP.TargetPort
	case p.PostgreSQL != nil:
		return p.PostgreSQL.TargetPort
	}
	return intstr.IntOrString{}
}

// ResolveProbePort resolves a probe's target port on a pod; ok is false when the pod lacks the
// named port (the probe cannot run there).
func ResolveProbePort(pod *corev1.Pod, p v1alpha1.Probe) (int32, bool) {
	t := ProbeTarget(p)
	if t.Type == intstr.Int && t.IntVal == 0 {
		return 0, false
	}
	return ResolvePort(pod, t, 0, corev1.ProtocolTCP)
}

// Publishable tells whether a pod may be published at all, and whether it is terminating.
// Pods without an IP, in a terminal phase, or not Running are never published, except that
// publishNotReadyAddresses publishes every non-terminal pod with an IP, like a Service.
func Publishable(pod *corev1.Pod, publishNotReady bool) bool {
	if pod.Status.PodIP == "" && len(pod.Status.PodIPs) == 0 {
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

// PodReady is the pod's Ready condition.
func PodReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Evaluate applies the per-port rule to one pod. It returns one Endpoint per entry of
// spec.ports, in order.
func Evaluate(spec *v1alpha1.ServiceWithHealthchecksSpec, pod *corev1.Pod, results Results) []Endpoint {
	out := make([]Endpoint, len(spec.Ports))
	publishable := Publishable(pod, spec.PublishNotReadyAddresses)
	terminating := pod.DeletionTimestamp != nil

	// Rule 1: the resolved target port of every Service port.
	resolved := make([]int32, len(spec.Ports))
	for i, sp := range spec.Ports {
		out[i].PortIndex = i
		out[i].PublishNotReady = spec.PublishNotReadyAddresses
		n, ok := ResolvePort(pod, sp.TargetPort, sp.Port, sp.Protocol)
		if ok {
			resolved[i] = n
			out[i].TargetPort = n
		}
		out[i].Published = ok && publishable
	}

	// Rules 2 and 3: which ports each probe checks. A probe whose named port the pod lacks
	// cannot run: it belongs to the Service ports with the same named target port (which are
	// unpublished on this pod anyway) or, when there are none, fails the pod as a whole.
	var probes []v1alpha1.Probe
	if spec.Healthcheck != nil {
		probes = spec.Healthcheck.Probes
	}
	checks := make([][]int, len(spec.Ports))
	var wholePod []int
	unresolvable := map[int]bool{}
	for pi, p := range probes {
		var matched []int
		n, ok := ResolveProbePort(pod, p)
		if ok {
			for i := range spec.Ports {
				if resolved[i] != 0 && resolved[i] == n {
					matched = append(matched, i)
				}
			}
		} else {
			t := ProbeTarget(p)
			for i, sp := range spec.Ports {
				if t.Type == intstr.String && sp.TargetPort.Type == intstr.String && sp.TargetPort.StrVal == t.StrVal {
					matched = append(matched, i)
				}
			}
			unresolvable[pi] = true
		}
		if len(matched) == 0 {
			wholePod = append(wholePod, pi)
			continue
		}
		for _, i := range matched {
			checks[i] = append(checks[i], pi)
		}
	}

	podReady := PodReady(pod)
	for i := range out {
		e := &out[i]
		if !e.Published {
			continue
		}
		e.Terminating = terminating
		e.Probes = append(append([]int(nil), checks[i]...), wholePod...)
		var serving bool
		if len(e.Probes) == 0 {
			// Rule 4, second half: an unprobed port follows the pod's Ready condition.
			serving, e.Decided = podReady, true
			if !podReady {
				e.Reason = "pod is not Ready"
			}
		} else {
			// Rules 4 and 5: every probe that checks the port must pass; pod readiness is
			// not consulted.
			serving, e.Decided, e.Reason = verdict(e.Probes, probes, results, unresolvable)
		}
		e.Ready, e.Serving, e.Terminating = Conditions(serving, terminating, spec.PublishNotReadyAddresses)
	}
	return out
}

// verdict combines the probes that check a port: any failure fails it (decided), all passing
// passes it (decided), otherwise it is undecided and not serving.
func verdict(idx []int, probes []v1alpha1.Probe, results Results, unresolvable map[int]bool) (bool, bool, string) {
	var reasons []string
	unknown := false
	for _, pi := range idx {
		if unresolvable[pi] {
			reasons = append(reasons, fmt.Sprintf("probe %d (%s): pod has no container port named %q", pi, probes[pi].Mode, ProbeTarget(probes[pi]).StrVal))
			continue
		}
		r := results[pi]
		switch r.State {
		case Fail:
			reasons = append(reasons, fmt.Sprintf("probe %d (%s): %s", pi, probes[pi].Mode, r.Reason))
		case Unknown:
			unknown = true
		}
	}
	if len(reasons) > 0 {
		return false, true, strings.Join(reasons, "; ")
	}
	if unknown {
		return false, false, "waiting for a decisive probe result"
	}
	return true, true, ""
}
