// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Command amplification counts the agent's reconciles per cause (issue 19 part 2, "No
// amplification"): the real agent program (built by run.sh) for one node, against a real
// kube-apiserver and etcd in an isolated test cluster (testkit/cluster, root), with a few
// resources and bulk pods on that node and no controller. After the steady state (every
// resource's slices published, the agent's reconcile counter flat) it runs phases of N events
// each: status writes that change only counts and conditions, status writes that change the
// ownership signal (status.clusterIP set or cleared), pod label changes on a pod no resource
// selects and on selected pods, spec edits, and EndpointSlice writes of other nodes. It reads
// the agent's own controller_runtime_reconcile_total{controller="agent"} before and after each
// event and prints a markdown section (development/BENCHMARKS-HISTORY.md, "Reconcile amplification").
//
// Every event is followed by a fence: a write through the same informer (watch events of one
// resource type arrive in order) that costs exactly one reconcile of a resource with nothing
// to publish. Once the counter has moved past the fence and stayed flat, the agent has seen the
// event and done everything it caused; the event's reconciles are the counter's move minus the
// fence's one. Control phases of fences alone show that a fence costs one reconcile.
//
//	bench/amplification/run.sh
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/loopback"
	"github.com/deckhouse/service-with-healthchecks/testkit/metrics"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

type options struct {
	agentBin   string
	events     int
	resources  int
	pods       int
	quiet      time.Duration
	deadline   time.Duration
	keepLogs   bool
	skipFences bool
}

func main() {
	cluster.Isolate()
	var o options
	flag.StringVar(&o.agentBin, "agent", "", "the agent program (images/agent/cmd/agent)")
	flag.IntVar(&o.events, "events", 10, "events per phase")
	flag.IntVar(&o.resources, "resources", 3, "resources with endpoints on the node (at least 3)")
	flag.IntVar(&o.pods, "pods", 3, "pods each resource selects (at least 2)")
	flag.DurationVar(&o.quiet, "quiet", 2*time.Second, "the reconcile counter is flat when it has not moved for this long")
	flag.DurationVar(&o.deadline, "deadline", time.Minute, "longest wait for a flat counter")
	flag.BoolVar(&o.keepLogs, "logs", false, "print the agent's log at the end")
	flag.BoolVar(&o.skipFences, "skip-fence-controls", false, "leave out the control phases of fences alone")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "amplification:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "amplification: %s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

const (
	node      = "node-a"
	leaseNS   = "swh-leases"
	podPort   = 8080
	fenceName = "fence"       // a resource whose Service is not its own: it publishes nothing
	ghostName = "fence-ghost" // the resource of the ghost slice: it does not exist
	portName  = "http"
	appLabel  = "app"
	tickLabel = "bench-tick"
)

// bench is the running benchmark: the cluster, the agent's metrics and the objects it edits.
type bench struct {
	o       options
	c       client.Client
	ns      string
	metrics string
	web     []*cluster.BulkPods // web[i] are the pods of resource res-i
	idle    *cluster.BulkPods   // pods no resource selects
	fence   *cluster.BulkPods   // the one pod of the fence resource
	seq     int
}

func resName(i int) string { return "res-" + strconv.Itoa(i) }

func run(o options) (err error) {
	if o.agentBin == "" {
		return errors.New("--agent is required (run.sh builds it)")
	}
	if o.resources < 3 || o.pods < 2 || o.events < 1 {
		return errors.New("--resources at least 3, --pods at least 2, --events at least 1")
	}
	c, err := cluster.New(cluster.Options{Nodes: []cluster.Node{{Name: node, Zone: "zone-a"}}})
	if err != nil {
		return fmt.Errorf("starting the cluster: %w", err)
	}
	defer func() {
		if serr := c.Stop(); serr != nil {
			err = errors.Join(err, serr)
		}
		if left := cluster.Leftovers(); len(left) > 0 {
			logf("left over: %v", left)
		}
	}()
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "swh-amplification-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	kubeconfig, err := c.Env.WriteKubeConfig(dir)
	if err != nil {
		return err
	}
	if err := c.Env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: leaseNS}}); err != nil {
		return fmt.Errorf("creating the lease namespace: %w", err)
	}
	ns, err := c.Env.CreateNamespace(ctx, "amplification")
	if err != nil {
		return err
	}
	b := &bench{o: o, c: c.Env.Client, ns: ns}
	var bulks []*cluster.BulkPods
	defer func() {
		for _, bp := range bulks {
			if rerr := bp.Remove(context.Background()); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()
	newBulk := func(prefix, app string, n, port int) (*cluster.BulkPods, error) {
		bp, err := c.NewBulkPods(ctx, cluster.BulkSpec{Namespace: ns, NamePrefix: prefix, Node: node, Count: n, Port: port, Labels: map[string]string{appLabel: app}})
		if err == nil {
			bulks = append(bulks, bp)
		}
		return bp, err
	}
	logf("creating %d resources with %d pods each, 2 unselected pods and the fences", o.resources, o.pods)
	for i := range o.resources {
		bp, err := newBulk("web"+strconv.Itoa(i), resName(i), o.pods, podPort)
		if err != nil {
			return err
		}
		b.web = append(b.web, bp)
		if err := b.createResource(ctx, resName(i), true); err != nil {
			return err
		}
	}
	if b.idle, err = newBulk("idle", "idle", 2, 0); err != nil {
		return err
	}
	if b.fence, err = newBulk("fence", fenceName, 1, podPort); err != nil {
		return err
	}
	if err := b.createResource(ctx, fenceName, false); err != nil {
		return err
	}
	ghost := sliceOf(ns, slicemeta.SliceKey{Resource: ghostName, Port: portName, Node: node}, "10.250.0.1")
	if err := b.c.Create(ctx, ghost); err != nil {
		return fmt.Errorf("creating the ghost slice: %w", err)
	}

	addrs, err := loopback.FreeAddrs(1)
	if err != nil {
		return err
	}
	b.metrics = addrs[0]
	stopAgent, err := start(dir, o.keepLogs, o.agentBin, "--node-name="+node, "--kubeconfig="+kubeconfig,
		"--metrics-bind-address="+b.metrics, "--health-probe-bind-address=0", "--lease-namespace="+leaseNS)
	if err != nil {
		return err
	}
	defer stopAgent()

	logf("waiting for the steady state: %d ready endpoints per resource, a flat reconcile counter", o.pods)
	for i := range o.resources {
		if err := b.waitPublished(ctx, resName(i), o.pods); err != nil {
			return err
		}
	}
	start, err := b.waitFlat(ctx, 0)
	if err != nil {
		return err
	}
	m0, err := metrics.Get(ctx, b.metrics)
	if err != nil {
		return err
	}
	logf("steady after %.0f reconciles (load %s)", start, process.LoadAvg())

	var results []result
	for _, p := range b.phases() {
		if p.control && o.skipFences {
			continue
		}
		r, err := b.runPhase(ctx, p)
		if err != nil {
			return fmt.Errorf("phase %q: %w", p.cause, err)
		}
		logf("%s: %d events, %.0f reconciles, %.0f slice writes (load %s)", p.cause, r.events, r.reconciles, r.sliceWrites, r.load)
		results = append(results, r)
		if p.restore != nil {
			if err := p.restore(ctx); err != nil {
				return fmt.Errorf("phase %q: restoring: %w", p.cause, err)
			}
			if _, err := b.waitFlat(ctx, 0); err != nil {
				return err
			}
		}
	}
	m1, err := metrics.Get(ctx, b.metrics)
	if err != nil {
		return err
	}
	probes := m1.Sum("swh_agent_probe_results_total", nil) - m0.Sum("swh_agent_probe_results_total", nil)
	report(o, results, probes)
	return nil
}

// createResource creates a resource selecting app=<name> with one HTTP probe; owned sets the
// status the controller would have written once the child Service is the resource's own.
func (b *bench) createResource(ctx context.Context, name string, owned bool) error {
	swh := &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Namespace: b.ns, Name: name},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Ports:    []v1alpha1.ServicePort{{Name: portName, Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(podPort)}},
			Selector: map[string]string{appLabel: name},
			Type:     corev1.ServiceTypeClusterIP,
			Healthcheck: &v1alpha1.Healthcheck{PeriodSeconds: 1, Probes: []v1alpha1.Probe{{
				Mode: v1alpha1.ProbeModeHTTP, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 1,
				HTTP: &v1alpha1.HTTPProbe{TargetPort: intstr.FromInt32(podPort), Path: "/healthz", Scheme: corev1.URISchemeHTTP},
			}}},
		},
	}
	if err := b.c.Create(ctx, swh); err != nil {
		return fmt.Errorf("creating %s: %w", name, err)
	}
	if !owned {
		return nil
	}
	return b.writeStatus(ctx, name, func(st *v1alpha1.ServiceWithHealthchecksStatus, gen int64) {
		st.ObservedGeneration = gen
		st.ClusterIP = "10.96.0.10"
		st.Ports = []v1alpha1.PortStatus{{Name: portName, Port: 80, ReadyEndpoints: int32(b.o.pods), TotalEndpoints: int32(b.o.pods)}} //nolint:gosec // a few pods
		st.ReadySummary = fmt.Sprintf("%s %d/%d", portName, b.o.pods, b.o.pods)
		apimeta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "EndpointsReady", ObservedGeneration: gen})
	})
}

// writeStatus changes a resource's status through the status subresource, as the controller
// does (here with the admin's identity: no controller runs, so nothing else writes status).
func (b *bench) writeStatus(ctx context.Context, name string, change func(*v1alpha1.ServiceWithHealthchecksStatus, int64)) error {
	var swh v1alpha1.ServiceWithHealthchecks
	if err := b.c.Get(ctx, types.NamespacedName{Namespace: b.ns, Name: name}, &swh); err != nil {
		return fmt.Errorf("reading %s: %w", name, err)
	}
	change(&swh.Status, swh.Generation)
	if err := b.c.Status().Update(ctx, &swh); err != nil {
		return fmt.Errorf("writing the status of %s: %w", name, err)
	}
	return nil
}

// editSpec toggles the resource's sessionAffinity: a spec change (a new generation) that
// changes nothing the agent publishes.
func (b *bench) editSpec(ctx context.Context, name string) error {
	var swh v1alpha1.ServiceWithHealthchecks
	if err := b.c.Get(ctx, types.NamespacedName{Namespace: b.ns, Name: name}, &swh); err != nil {
		return fmt.Errorf("reading %s: %w", name, err)
	}
	if swh.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		swh.Spec.SessionAffinity = corev1.ServiceAffinityNone
	} else {
		swh.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	}
	if err := b.c.Update(ctx, &swh); err != nil {
		return fmt.Errorf("editing the spec of %s: %w", name, err)
	}
	return nil
}

// setPodLabel sets (or with value "" removes) one label of a Pod object.
func (b *bench) setPodLabel(ctx context.Context, pod *cluster.Pod, key, value string) error {
	var v any = value
	if value == "" {
		v = nil
	}
	patch, err := jsonMergePatchLabel(key, v)
	if err != nil {
		return err
	}
	obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}}
	if err := b.c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("labelling Pod %s: %w", pod.Key(), err)
	}
	return nil
}

// sliceOf is a slice of this module as the agent of k.Node writes it, one ready endpoint.
func sliceOf(ns string, k slicemeta.SliceKey, ip string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: k.Name(), Labels: k.Labels(), Annotations: k.Annotations(),
			OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference(k.Resource, "00000000-0000-0000-0000-000000000000")},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(k.Node),
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To(k.Port), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](podPort)}},
	}
}

// flipSlice flips the one endpoint of a slice between ready and not ready.
func (b *bench) flipSlice(ctx context.Context, name string) error {
	var s discoveryv1.EndpointSlice
	if err := b.c.Get(ctx, types.NamespacedName{Namespace: b.ns, Name: name}, &s); err != nil {
		return fmt.Errorf("reading slice %s: %w", name, err)
	}
	ready := !*s.Endpoints[0].Conditions.Ready
	s.Endpoints[0].Conditions.Ready, s.Endpoints[0].Conditions.Serving = &ready, &ready
	if err := b.c.Update(ctx, &s); err != nil {
		return fmt.Errorf("updating slice %s: %w", name, err)
	}
	return nil
}

// reconciles reads the agent's reconcile counter (every result: success, error, requeue).
func (b *bench) reconciles(ctx context.Context) (float64, error) {
	fams, err := metrics.Get(ctx, b.metrics)
	if err != nil {
		return 0, err
	}
	return fams.Sum("controller_runtime_reconcile_total", map[string]string{"controller": "agent"}), nil
}

func (b *bench) sliceWrites(ctx context.Context) (float64, error) {
	fams, err := metrics.Get(ctx, b.metrics)
	if err != nil {
		return 0, err
	}
	return fams.Sum("swh_agent_endpointslice_writes_total", nil), nil
}

// waitFlat polls the reconcile counter until it is at least atLeast and has not moved for
// the quiet time, and returns it.
func (b *bench) waitFlat(ctx context.Context, atLeast float64) (float64, error) {
	deadline := time.Now().Add(b.o.deadline)
	last, err := b.reconciles(ctx)
	if err != nil {
		return 0, err
	}
	since := time.Now()
	for last < atLeast || time.Since(since) < b.o.quiet {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the reconcile counter was not flat at %.0f (at least %.0f) within %s", last, atLeast, b.o.deadline)
		}
		time.Sleep(100 * time.Millisecond) // the polling interval
		cur, err := b.reconciles(ctx)
		if err != nil {
			return 0, err
		}
		if cur != last {
			last, since = cur, time.Now()
		}
	}
	return last, nil
}

// waitPublished waits until the resource's slices on the node hold n ready endpoints.
func (b *bench) waitPublished(ctx context.Context, name string, n int) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var list discoveryv1.EndpointSliceList
		if err := b.c.List(ctx, &list, client.InNamespace(b.ns), client.MatchingLabels{wellknown.LabelResource: name, wellknown.LabelNodeKey: slicemeta.NodeKey(node)}); err != nil {
			return fmt.Errorf("listing slices: %w", err)
		}
		ready := 0
		for _, s := range list.Items {
			for _, ep := range s.Endpoints {
				if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
					ready++
				}
			}
		}
		if ready == n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d of %d endpoints ready after 3 minutes", name, ready, n)
		}
		time.Sleep(time.Second) // the polling interval
	}
}

// phase is one cause: an event made N times, each followed by a fence of the same informer.
type phase struct {
	cause, expect string
	control       bool // a control phase: fences alone
	positive      bool // a positive control: the counter must move
	event         func(ctx context.Context, i int) error
	fence         func(ctx context.Context) error
	restore       func(ctx context.Context) error
}

type result struct {
	phase
	events      int
	reconciles  float64 // the events' own (the fences' taken off)
	fences      float64 // reconciles the fences were counted for
	sliceWrites float64
	load        string
}

// The fences: a write through the informer of the phase's events that reconciles one resource
// with nothing to publish, once.
func (b *bench) resourceFence(ctx context.Context) error { return b.editSpec(ctx, fenceName) }

func (b *bench) podFence(ctx context.Context) error {
	b.seq++
	return b.setPodLabel(ctx, b.fence.Pods[0], tickLabel, strconv.Itoa(b.seq))
}

func (b *bench) sliceFence(ctx context.Context) error {
	return b.flipSlice(ctx, slicemeta.SliceKey{Resource: ghostName, Port: portName, Node: node}.Name())
}

func (b *bench) phases() []phase {
	none := func(context.Context, int) error { return nil }
	moved := b.web[0].Pods[b.o.pods-1]
	others := func(i int) slicemeta.SliceKey {
		return slicemeta.SliceKey{Resource: resName(0), Port: portName, Node: "node-other-" + strconv.Itoa(i)}
	}
	return []phase{
		{cause: "control: resource fence alone (spec edit of a resource with nothing to publish)", expect: "0 beyond the fence", control: true, event: none, fence: b.resourceFence},
		{cause: "control: pod fence alone (label change on the fence resource's pod)", expect: "0 beyond the fence", control: true, event: none, fence: b.podFence},
		{cause: "control: slice fence alone (write of a slice of this node of no resource)", expect: "0 beyond the fence", control: true, event: none, fence: b.sliceFence},
		{
			cause: "1. status write changing only per-port counts and conditions", expect: "0",
			event: func(ctx context.Context, i int) error {
				return b.writeStatus(ctx, resName(0), func(st *v1alpha1.ServiceWithHealthchecksStatus, gen int64) {
					ready := int32(b.o.pods - i%2)                                                                                       //nolint:gosec // a few pods
					st.Ports = []v1alpha1.PortStatus{{Name: portName, Port: 80, ReadyEndpoints: ready, TotalEndpoints: int32(b.o.pods)}} //nolint:gosec // a few pods
					st.ReadySummary = fmt.Sprintf("%s %d/%d", portName, ready, b.o.pods)
					cond := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "EndpointsReady", ObservedGeneration: gen}
					if i%2 == 0 {
						cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "EndpointsNotReady", fmt.Sprintf("%s: %d of %d ready", portName, ready, b.o.pods)
					}
					apimeta.SetStatusCondition(&st.Conditions, cond)
				})
			},
			fence: b.resourceFence,
		},
		{
			cause: "2. status write changing ownership (status.clusterIP cleared / set)", expect: ">= 1", positive: true,
			event: func(ctx context.Context, i int) error {
				return b.writeStatus(ctx, resName(1), func(st *v1alpha1.ServiceWithHealthchecksStatus, _ int64) {
					st.ClusterIP = map[bool]string{true: "", false: "10.96.0.10"}[i%2 == 0]
				})
			},
			fence: b.resourceFence,
			restore: func(ctx context.Context) error {
				return b.writeStatus(ctx, resName(1), func(st *v1alpha1.ServiceWithHealthchecksStatus, _ int64) { st.ClusterIP = "10.96.0.10" })
			},
		},
		{
			cause: "3. pod label change on a pod no resource selects", expect: "0",
			event: func(ctx context.Context, i int) error {
				return b.setPodLabel(ctx, b.idle.Pods[i%len(b.idle.Pods)], tickLabel, strconv.Itoa(i))
			},
			fence: b.podFence,
		},
		{
			cause: "4a. pod label change on a selected pod that keeps it selected", expect: ">= 1", positive: true,
			event: func(ctx context.Context, i int) error {
				return b.setPodLabel(ctx, b.web[0].Pods[0], tickLabel, strconv.Itoa(i))
			},
			fence: b.podFence,
		},
		{
			cause: "4b. pod label change moving a selected pod out of its selector / back in", expect: ">= 1", positive: true,
			event: func(ctx context.Context, i int) error {
				return b.setPodLabel(ctx, moved, appLabel, map[bool]string{true: "moved-out", false: resName(0)}[i%2 == 0])
			},
			fence: b.podFence,
			restore: func(ctx context.Context) error {
				if err := b.setPodLabel(ctx, moved, appLabel, resName(0)); err != nil {
					return err
				}
				return b.waitPublished(ctx, resName(0), b.o.pods)
			},
		},
		{
			cause: "5. spec edit (a new generation)", expect: ">= 1", positive: true,
			event: func(ctx context.Context, _ int) error { return b.editSpec(ctx, resName(2)) },
			fence: b.resourceFence,
		},
		{
			cause: "6. EndpointSlice write of another node's agent (create / flip)", expect: "0",
			event: func(ctx context.Context, i int) error {
				if i%2 == 0 {
					if err := b.c.Create(ctx, sliceOf(b.ns, others(i/2), "10.251.0."+strconv.Itoa(i/2+1))); err != nil {
						return fmt.Errorf("creating another node's slice: %w", err)
					}
					return nil
				}
				return b.flipSlice(ctx, others(i/2).Name())
			},
			fence: b.sliceFence,
		},
	}
}

// runPhase makes the phase's events one at a time: the counter before, the event, its fence,
// then the counter once it has moved past the fence and is flat again.
func (b *bench) runPhase(ctx context.Context, p phase) (result, error) {
	r := result{phase: p, load: process.LoadAvg()}
	w0, err := b.sliceWrites(ctx)
	if err != nil {
		return r, err
	}
	for i := range b.o.events {
		c0, err := b.reconciles(ctx)
		if err != nil {
			return r, err
		}
		if err := p.event(ctx, i); err != nil {
			return r, err
		}
		if err := p.fence(ctx); err != nil {
			return r, err
		}
		c1, err := b.waitFlat(ctx, c0+1)
		if err != nil {
			return r, err
		}
		r.events++
		r.fences++
		r.reconciles += c1 - c0 - 1
	}
	w1, err := b.sliceWrites(ctx)
	if err != nil {
		return r, err
	}
	r.sliceWrites = w1 - w0
	return r, nil
}

func report(o options, results []result, probes float64) {
	fmt.Printf("## Reconcile amplification (bench/amplification)\n\n")
	fmt.Printf("The agent program for one node, real kube-apiserver and etcd, no controller; %d resources with %d pods each\n", o.resources, o.pods)
	fmt.Printf("(one HTTP probe every second), 2 pods no resource selects, a fence resource with one pod and no Service of its own.\n")
	fmt.Printf("Each event is followed by a fence (a write through the same informer that reconciles the fence resource once);\n")
	fmt.Printf("reconciles are read from the agent's controller_runtime_reconcile_total{controller=\"agent\"} once it is flat for %s,\n", o.quiet)
	fmt.Printf("the fence's one taken off. Status is written as the admin, as the controller would write it.\n\n")
	fmt.Printf("| cause | events | agent reconciles | reconciles per event | expected | agent slice writes |\n| --- | ---: | ---: | ---: | --- | ---: |\n")
	moved := true
	for _, r := range results {
		fmt.Printf("| %s | %d | %.0f | %.2f | %s | %.0f |\n", r.cause, r.events, r.reconciles, r.reconciles/float64(r.events), r.expect, r.sliceWrites)
		if r.positive && r.reconciles <= 0 {
			moved = false
		}
	}
	fences := 0.0
	for _, r := range results {
		fences += r.fences
	}
	fmt.Printf("\nValidity: %.0f probes ran during the phases (%s); the counter moved in every positive-control phase (2, 4a, 4b, 5): %s; %.0f fences, one reconcile each taken off.\n",
		probes, map[bool]string{true: "the agent worked", false: "NONE: the agent did not probe"}[probes > 0], map[bool]string{true: "yes", false: "NO: the figures are not valid"}[moved], fences)
}

// start runs the program with its output in a log file; the returned function stops it by PID
// (SIGTERM, SIGKILL after the grace) and, with logs, prints its log.
func start(dir string, logs bool, bin string, args ...string) (func(), error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG=")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logPath := filepath.Join(dir, "agent.log")
	p, err := process.Start("the agent", cmd, process.Options{LogFile: logPath})
	if err != nil {
		return nil, err
	}
	return func() {
		_ = p.Stop()
		if logs {
			if b, err := os.ReadFile(logPath); err == nil {
				fmt.Fprintf(os.Stderr, "--- agent log:\n%s\n", b)
			}
		}
	}, nil
}

// jsonMergePatchLabel is a JSON merge patch of one label (a nil value removes it).
func jsonMergePatchLabel(key string, value any) ([]byte, error) {
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{key: value}}})
	if err != nil {
		return nil, fmt.Errorf("encoding a label patch: %w", err)
	}
	return b, nil
}
