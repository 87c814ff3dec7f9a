// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package portrule

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

func tcpProbe(target intstr.IntOrString) v1alpha1.Probe {
	return v1alpha1.Probe{Mode: v1alpha1.ProbeModeTCP, SuccessThreshold: 1, FailureThreshold: 3, TCP: &v1alpha1.TCPProbe{TargetPort: target}}
}

func httpProbe(target intstr.IntOrString) v1alpha1.Probe {
	return v1alpha1.Probe{Mode: v1alpha1.ProbeModeHTTP, SuccessThreshold: 1, FailureThreshold: 3, HTTP: &v1alpha1.HTTPProbe{TargetPort: target, Path: "/"}}
}

type podOpt func(*corev1.Pod)

func newPod(opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "vm-1", Namespace: "ns"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main",
			Ports: []corev1.ContainerPort{
				{Name: "web", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
				{Name: "smtp", ContainerPort: 2525, Protocol: corev1.ProtocolTCP},
				{Name: "health", ContainerPort: 9000, Protocol: corev1.ProtocolTCP},
			},
		}}},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			PodIP:      "10.0.0.5",
			PodIPs:     []corev1.PodIP{{IP: "10.0.0.5"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func notReady(p *corev1.Pod) {
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
}

func terminating(p *corev1.Pod) {
	now := metav1.Now()
	p.DeletionTimestamp = &now
}

func webSMTP() []v1alpha1.ServicePort {
	return []v1alpha1.ServicePort{
		{Name: "web", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("web")},
		{Name: "smtp", Port: 25, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(2525)},
	}
}

// cond is the expected outcome of one port: published, target port, ready, serving,
// terminating, decided.
type cond struct {
	published   bool
	target      int32
	ready       bool
	serving     bool
	terminating bool
	decided     bool
}

func TestEvaluate(t *testing.T) {
	pass := ProbeResult{State: Pass}
	fail := ProbeResult{State: Fail, Reason: "connection refused"}
	tests := map[string]struct {
		ports           []v1alpha1.ServicePort
		probes          []v1alpha1.Probe
		publishNotReady bool
		pod             *corev1.Pod
		results         Results
		want            []cond
	}{
		"a numeric target port resolves to itself and a named one through the container ports": {
			ports:   webSMTP(),
			probes:  []v1alpha1.Probe{httpProbe(intstr.FromInt32(8080)), tcpProbe(intstr.FromInt32(2525))},
			pod:     newPod(),
			results: Results{0: pass, 1: pass},
			want:    []cond{{true, 8080, true, true, false, true}, {true, 2525, true, true, false, true}},
		},
		"an omitted target port equals the Service port": {
			ports:   []v1alpha1.ServicePort{{Port: 2525, Protocol: corev1.ProtocolTCP}},
			probes:  []v1alpha1.Probe{tcpProbe(intstr.FromInt32(2525))},
			pod:     newPod(),
			results: Results{0: pass},
			want:    []cond{{true, 2525, true, true, false, true}},
		},
		"a pod that lacks a named target port is not published on that port only": {
			ports:   []v1alpha1.ServicePort{{Name: "imap", Port: 143, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("imap")}, webSMTP()[1]},
			probes:  []v1alpha1.Probe{tcpProbe(intstr.FromInt32(2525))},
			pod:     newPod(),
			results: Results{0: pass},
			want:    []cond{{published: false}, {true, 2525, true, true, false, true}},
		},
		"a named port of another protocol does not resolve": {
			ports:   []v1alpha1.ServicePort{{Name: "web", Port: 80, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromString("web")}},
			pod:     newPod(),
			results: Results{},
			want:    []cond{{published: false}},
		},
		"a failing probe on one port withdraws the pod from that port only": {
			ports:   webSMTP(),
			probes:  []v1alpha1.Probe{httpProbe(intstr.FromString("web")), tcpProbe(intstr.FromInt32(2525))},
			pod:     newPod(),
			results: Results{0: pass, 1: fail},
			want:    []cond{{true, 8080, true, true, false, true}, {true, 2525, false, false, false, true}},
		},
		"a probe given by name checks the port whose target port resolves to the same number": {
			ports:   webSMTP(),
			probes:  []v1alpha1.Probe{tcpProbe(intstr.FromString("smtp"))},
			pod:     newPod(),
			results: Results{0: fail},
			want:    []cond{{true, 8080, true, true, false, true}, {true, 2525, false, false, false, true}},
		},
		"several probes on one port must all pass": {
			ports:   webSMTP(),
			probes:  []v1alpha1.Probe{httpProbe(intstr.FromInt32(8080)), tcpProbe(intstr.FromInt32(8080)), tcpProbe(intstr.FromInt32(2525))},
			pod:     newPod(),
			results: Results{0: pass, 1: fail, 2: pass},
			want:    []cond{{true, 8080, false, false, false, true}, {true, 2525, true, true, false, true}},
		},
		"a probe matching two Service ports checks both of them": {
			ports: []v1alpha1.ServicePort{
				{Name: "a", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)},
				{Name: "b", Port: 81, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("web")},
				{Name: "c", Port: 25, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(2525)},
			},
			probes:  []v1alpha1.Probe{httpProbe(intstr.FromInt32(8080))},
			pod:     newPod(),
			results: Results{0: fail},
			want:    []cond{{true, 8080, false, false, false, true}, {true, 8080, false, false, false, true}, {true, 2525, true, true, false, true}},
		},
		"a failing probe on a dedicated health port withdraws the pod from every port": {
			ports:   webSMTP(),
			probes:  []v1alpha1.Probe{httpProbe(intstr.FromInt32(8080)), httpProbe(intstr.FromString("health"))},
			pod:     newPod(),
			results: Results{0: pass, 1: fail},
			want:    []cond{{true, 8080, false, false, false, true}, {true, 2525, false, false, false, true}},
		},
		"a passing whole-pod probe makes an otherwise unprobed port ignore the pod's readiness": {
			ports:   webSMTP(),
			probes:  []v1alpha1.Probe{httpProbe(intstr.FromInt32(9000))},
			pod:     newPod(notReady),
			results: Results{0: pass},
			want:    []cond{{true, 8080, true, true, false, true}, {true, 2525, true, true, false, true}},
		},
		"a port no probe checks follows the pod's Ready condition when the pod is ready": {
			ports:   webSMTP(),
			probes:  []v1alpha1.Probe{httpProbe(intstr.FromInt32(8080))},
			pod:     newPod(),
			results: Results{0: fail},
			want:    []cond{{true, 8080, false, false, false, true}, {true, 2525, true, true, false, true}},
		},
		"a port no probe checks follows the pod's Ready condition when the pod is not ready": {
			ports:   webSMTP(),
			probes:  []v1alpha1.Probe{httpProbe(intstr.FromInt32(8080))},
			pod:     newPod(notReady),
			results: Results{0: pass},
			want:    []cond{{true, 8080, true, true, false, true}, {true, 2525, false, false, false, true}},
		},
		"a resource without a healthcheck follows the pod's Ready condition on every port": {
			ports: webSMTP(),
			pod:   newPod(notReady),
			want:  []cond{{true, 8080, false, false, false, true}, {true, 2525, false, false, false, true}},
		},
		"the pod's own readiness does not gate a probed port": {
			ports:   webSMTP(),
			probes:  []v1alpha1.Probe{httpProbe(intstr.FromInt32(8080)), tcpProbe(intstr.FromInt32(2525))},
			pod:     newPod(notReady),
			results: Results{0: pass, 1: pass},
			want:    []cond{{true, 8080, true, true, false, true}, {true, 2525, true, true, false, true}},
		},
		"a probe without a decisive result leaves the port undecided and not ready": {
			ports:   webSMTP(),
			probes:  []v1alpha1.Probe{httpProbe(intstr.FromInt32(8080)), tcpProbe(intstr.FromInt32(2525))},
			pod:     newPod(),
			results: Results{1: pass},
			want:    []cond{{true, 8080, false, false, false, false}, {true, 2525, true, true, false, true}},
		},
		"a failure decides a port even while another of its probes is undecided": {
			ports:   webSMTP()[:1],
			probes:  []v1alpha1.Probe{httpProbe(intstr.FromInt32(8080)), tcpProbe(intstr.FromInt32(9000))},
			pod:     newPod(),
			results: Results{1: fail},
			want:    []cond{{true, 8080, false, false, false, true}},
		},
		"a whole-pod probe whose named port the pod lacks fails every port": {
			ports:   webSMTP(),
			probes:  []v1alpha1.Probe{tcpProbe(intstr.FromString("admin"))},
			pod:     newPod(),
			results: Results{0: pass},
			want:    []cond{{true, 8080, false, false, false, true}, {true, 2525, false, false, false, true}},
		},
		"a probe on a named port the pod lacks stays with the Service port of the same name": {
			ports: []v1alpha1.ServicePort{
				{Name: "imap", Port: 143, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("imap")},
				webSMTP()[1],
			},
			probes:  []v1alpha1.Probe{tcpProbe(intstr.FromString("imap"))},
			pod:     newPod(),
			results: Results{},
			want:    []cond{{published: false}, {true, 2525, true, true, false, true}},
		},
		"a terminating pod that passes is published not ready, serving and terminating": {
			ports:   webSMTP(),
			probes:  []v1alpha1.Probe{httpProbe(intstr.FromInt32(8080)), tcpProbe(intstr.FromInt32(2525))},
			pod:     newPod(terminating),
			results: Results{0: pass, 1: fail},
			want:    []cond{{true, 8080, false, true, true, true}, {true, 2525, false, false, true, true}},
		},
		"publishNotReadyAddresses publishes a failing pod as ready": {
			ports:           webSMTP(),
			probes:          []v1alpha1.Probe{httpProbe(intstr.FromInt32(8080))},
			publishNotReady: true,
			pod:             newPod(notReady),
			results:         Results{0: fail},
			want:            []cond{{true, 8080, true, false, false, true}, {true, 2525, true, false, false, true}},
		},
		"publishNotReadyAddresses publishes a pending pod that has an IP": {
			ports:           webSMTP(),
			publishNotReady: true,
			pod:             newPod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }),
			want:            []cond{{true, 8080, true, true, false, true}, {true, 2525, true, true, false, true}},
		},
		"publishNotReadyAddresses does not publish a pod without an IP": {
			ports:           webSMTP(),
			publishNotReady: true,
			pod:             newPod(func(p *corev1.Pod) { p.Status.PodIP, p.Status.PodIPs = "", nil }),
			want:            []cond{{published: false}, {published: false}},
		},
		"a pod without an IP is never published": {
			ports:   webSMTP(),
			probes:  []v1alpha1.Probe{httpProbe(intstr.FromInt32(8080))},
			pod:     newPod(func(p *corev1.Pod) { p.Status.PodIP, p.Status.PodIPs = "", nil }),
			results: Results{0: pass},
			want:    []cond{{published: false}, {published: false}},
		},
		"a pending pod is never published": {
			ports:   webSMTP(),
			probes:  []v1alpha1.Probe{httpProbe(intstr.FromInt32(8080))},
			pod:     newPod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }),
			results: Results{0: pass},
			want:    []cond{{published: false}, {published: false}},
		},
		"a pod in a terminal phase is never published": {
			ports:   webSMTP(),
			probes:  []v1alpha1.Probe{httpProbe(intstr.FromInt32(8080))},
			pod:     newPod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
			results: Results{0: pass},
			want:    []cond{{published: false}, {published: false}},
		},
		"a failed pod is not published even with publishNotReadyAddresses": {
			ports:           webSMTP(),
			publishNotReady: true,
			pod:             newPod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }),
			want:            []cond{{published: false}, {published: false}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			spec := &v1alpha1.ServiceWithHealthchecksSpec{Ports: tc.ports, PublishNotReadyAddresses: tc.publishNotReady}
			if tc.probes != nil {
				spec.Healthcheck = &v1alpha1.Healthcheck{PeriodSeconds: 10, Probes: tc.probes}
			}
			got := Evaluate(spec, tc.pod, tc.results)
			var gotConds []cond
			for i, e := range got {
				assert.Equal(t, i, e.PortIndex)
				if !e.Published {
					gotConds = append(gotConds, cond{})
					continue
				}
				gotConds = append(gotConds, cond{true, e.TargetPort, e.Ready, e.Serving, e.Terminating, e.Decided})
				if !e.Serving && e.Decided {
					assert.NotEmpty(t, e.Reason, "a port that does not serve says why")
				}
			}
			assert.Equal(t, tc.want, gotConds)
		})
	}
}

func TestEvaluateReasonNamesTheFailingProbe(t *testing.T) {
	spec := &v1alpha1.ServiceWithHealthchecksSpec{
		Ports:       webSMTP(),
		Healthcheck: &v1alpha1.Healthcheck{Probes: []v1alpha1.Probe{tcpProbe(intstr.FromInt32(2525))}},
	}
	got := Evaluate(spec, newPod(), Results{0: {State: Fail, Reason: "connection refused"}})
	assert.Contains(t, got[1].Reason, "connection refused")
	assert.Contains(t, got[1].Reason, "TCP")
	assert.Equal(t, []int{0}, got[1].Probes)
	assert.Empty(t, got[0].Probes, "web has no probe")
}

func TestEvaluateWithoutPorts(t *testing.T) {
	spec := &v1alpha1.ServiceWithHealthchecksSpec{ClusterIP: "None", Healthcheck: &v1alpha1.Healthcheck{Probes: []v1alpha1.Probe{
		tcpProbe(intstr.FromInt32(5432)), httpProbe(intstr.FromString("health")),
	}}}
	b := Bind(spec, newPod())
	assert.Equal(t, []int{0, 1}, b.WholePod, "with no port to check, every probe checks the pod as a whole")
	cases := map[string]struct {
		results Results
		want    cond
	}{
		"every probe passing serves":  {Results{0: {State: Pass}, 1: {State: Pass}}, cond{published: true, ready: true, serving: true, decided: true}},
		"one probe failing withdraws": {Results{0: {State: Pass}, 1: {State: Fail, Reason: "HTTP 503"}}, cond{published: true, decided: true}},
		"an unknown result waits":     {Results{0: {State: Pass}}, cond{published: true}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			eps := b.Evaluate(spec, tc.results)
			require.Len(t, eps, 1, "one endpoint: the pod")
			e := eps[0]
			assert.Equal(t, NoPort, e.PortIndex)
			assert.Equal(t, tc.want, cond{e.Published, e.TargetPort, e.Ready, e.Serving, e.Terminating, e.Decided})
		})
	}
}

func TestAppendEvaluateKeepsThePodsBeforeAndMatchesEvaluate(t *testing.T) {
	spec := &v1alpha1.ServiceWithHealthchecksSpec{
		Ports: webSMTP(),
		Healthcheck: &v1alpha1.Healthcheck{Probes: []v1alpha1.Probe{
			tcpProbe(intstr.FromInt32(2525)), httpProbe(intstr.FromString("health")),
		}},
	}
	failing := Results{0: {State: Fail, Reason: "connection refused"}, 1: {State: Pass}}
	passing := Results{0: {State: Pass}, 1: {State: Pass}}
	first, second := Bind(spec, newPod()), Bind(spec, newPod(notReady))

	buf := first.AppendEvaluate(make([]Endpoint, 0, 1), spec, failing) // too small: it grows
	firstCopy := append([]Endpoint(nil), buf...)
	buf = second.AppendEvaluate(buf, spec, passing)

	require.Len(t, buf, 4, "two pods, two ports each")
	assert.Equal(t, first.Evaluate(spec, failing), buf[:2], "the first pod's endpoints")
	assert.Equal(t, firstCopy, buf[:2], "appending the second pod leaves the first one's alone")
	assert.Equal(t, second.Evaluate(spec, passing), buf[2:], "the second pod's endpoints")
	assert.Equal(t, []int{0, 1}, buf[1].Probes, "smtp: its own probe, then the whole-pod one")
	assert.Equal(t, []int{1}, buf[0].Probes, "web: only the whole-pod probe")
	assert.False(t, buf[1].Serving, "smtp fails on the first pod")
	assert.True(t, buf[3].Serving, "smtp serves on the second pod, whose Ready condition is not consulted")
}

// A Binder hands out windows of shared buffers: a binding made before the buffers run out is
// left alone by the bindings after it, and each is the binding Bind makes alone.
func TestABindersBindingsStayWhatBindGives(t *testing.T) {
	spec := &v1alpha1.ServiceWithHealthchecksSpec{
		Ports: webSMTP(),
		Healthcheck: &v1alpha1.Healthcheck{Probes: []v1alpha1.Probe{
			tcpProbe(intstr.FromInt32(2525)), httpProbe(intstr.FromString("health")), tcpProbe(intstr.FromString("missing")),
		}},
	}
	withoutWeb := func(p *corev1.Pod) { p.Spec.Containers[0].Ports = p.Spec.Containers[0].Ports[1:] }
	pods := []*corev1.Pod{newPod(), newPod(withoutWeb), newPod(notReady), newPod(withoutWeb, terminating)}
	bd := NewBinder(spec, 1) // room for one pod: the next three replace the buffers
	var got []Binding
	for _, p := range pods {
		got = append(got, bd.Bind(spec, p))
	}
	for i, p := range pods {
		assert.Equal(t, Bind(spec, p), got[i], "pod %d", i)
	}
	assert.NotEqual(t, got[0].Ports, got[1].Ports, "the pods differ in the web port")
}

// A port's verdict says when it was decided: a passing port by the last of its passing probes,
// a failing one by the first of its failing probes, an unprobed port by the pod's Ready
// transition, a terminating pod's port by its deletion when that is later. The agent stamps the
// slice write the verdict causes with it (kube-proxy's network programming latency).
func TestEvaluateSaysWhenTheVerdictWasDecided(t *testing.T) {
	base := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return base.Add(time.Duration(s) * time.Second) }
	// web is checked by probe 0 and the whole-pod probe 2; smtp by probe 1 and probe 2.
	probes := []v1alpha1.Probe{httpProbe(intstr.FromString("web")), tcpProbe(intstr.FromInt32(2525)), tcpProbe(intstr.FromString("health"))}
	spec := &v1alpha1.ServiceWithHealthchecksSpec{Ports: webSMTP(), Healthcheck: &v1alpha1.Healthcheck{PeriodSeconds: 10, Probes: probes}}
	tests := map[string]struct {
		pod     *corev1.Pod
		spec    *v1alpha1.ServiceWithHealthchecksSpec
		results Results
		want    []time.Time
	}{
		"passing ports: the last pass that decided them": {
			pod:     newPod(),
			results: Results{{State: Pass, At: at(5)}, {State: Pass, At: at(2)}, {State: Pass, At: at(3)}},
			want:    []time.Time{at(5), at(3)},
		},
		"a failing port: its first failure; the other port keeps its own time": {
			pod:     newPod(),
			results: Results{{State: Fail, At: at(9)}, {State: Pass, At: at(2)}, {State: Pass, At: at(3)}},
			want:    []time.Time{at(9), at(3)},
		},
		"two failures: the earlier one decided": {
			pod:     newPod(),
			results: Results{{State: Fail, At: at(9)}, {State: Pass, At: at(2)}, {State: Fail, At: at(7)}},
			want:    []time.Time{at(7), at(7)},
		},
		"undecided: no time": {
			pod:     newPod(),
			results: Results{{State: Pass, At: at(5)}},
			want:    []time.Time{{}, {}},
		},
		"an unprobed port follows the pod's Ready transition": {
			pod: newPod(func(p *corev1.Pod) {
				p.Status.Conditions[0].LastTransitionTime = metav1.NewTime(at(4))
			}),
			spec: &v1alpha1.ServiceWithHealthchecksSpec{Ports: webSMTP()},
			want: []time.Time{at(4), at(4)},
		},
		"a terminating pod: its deletion, asked for after the verdicts": {
			pod: newPod(func(p *corev1.Pod) {
				deleted := metav1.NewTime(at(40))
				grace := int64(30)
				p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &deleted, &grace
			}),
			results: Results{{State: Pass, At: at(5)}, {State: Pass, At: at(2)}, {State: Pass, At: at(3)}},
			want:    []time.Time{at(10), at(10)},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := spec
			if tc.spec != nil {
				s = tc.spec
			}
			var got []time.Time
			for _, e := range Evaluate(s, tc.pod, tc.results) {
				got = append(got, e.Changed)
			}
			assert.Equal(t, tc.want, got)
		})
	}
}
