// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// leaseNamespace is where the agents renew their Leases (the controller's default
// --agent-lease-namespace).
const leaseNamespace = wellknown.Namespace

func nodeName(i int) string     { return fmt.Sprintf("node-%04d", i) }
func resourceName(i int) string { return fmt.Sprintf("res-%02d", i) }
func burstName(i int) string    { return fmt.Sprintf("burst-%05d", i) }

// parallel runs do(i) for i in [0, n) on workers goroutines and returns the first error.
func parallel(n, workers int, do func(i int) error) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := do(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		mu.Lock()
		failed := first != nil
		mu.Unlock()
		if failed {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// resource is a ServiceWithHealthchecks with one TCP port and one TCP probe, like bench/scale's.
func resource(ns, name string) *v1alpha1.ServiceWithHealthchecks {
	return &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Selector: map[string]string{"app": name},
			Ports:    []v1alpha1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
			Healthcheck: &v1alpha1.Healthcheck{PeriodSeconds: 1, Probes: []v1alpha1.Probe{{
				Mode: v1alpha1.ProbeModeTCP, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3,
				TCP: &v1alpha1.TCPProbe{TargetPort: intstr.FromInt32(8080)},
			}}},
		},
	}
}

// agentSlice is the slice the agent of the pod's node publishes for resource (port "http"): the
// agent's name, labels, annotation and owner reference, one ready endpoint of the pod.
func agentSlice(ns, res string, uid types.UID, pod *corev1.Pod) *discoveryv1.EndpointSlice {
	node := pod.Spec.NodeName
	key := slicemeta.SliceKey{Resource: res, Port: "http", Node: node}
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: key.Name(), Labels: key.Labels(), Annotations: key.Annotations(),
			OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference(res, uid)},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{pod.Status.PodIP},
			Conditions: readyConditions(),
			NodeName:   ptr.To(node),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod.Name, UID: pod.UID},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
}

func readyConditions() discoveryv1.EndpointConditions {
	return discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}
}

// fleetPod creates the pod of resource ri on node ni (selected by the resource, running, with
// an IP), as a real cluster has one behind every endpoint: the controller's audit of published
// endpoints (development/CONTROLLER.md) reads the node's pods for every slice it audits and
// deletes a slice whose endpoint names no such pod.
func fleetPod(ctx context.Context, c client.Client, ns string, ri, ni int) (*corev1.Pod, error) {
	n := ri*100000 + ni
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%s", resourceName(ri), nodeName(ni)), Labels: map[string]string{"app": resourceName(ri)}},
		Spec:       corev1.PodSpec{NodeName: nodeName(ni), Containers: []corev1.Container{{Name: "app", Image: "fleet.invalid/pod:latest"}}},
	}
	if err := c.Create(ctx, pod); err != nil {
		return nil, fmt.Errorf("creating Pod %s: %w", pod.Name, err)
	}
	ip := fmt.Sprintf("10.%d.%d.%d", 64+n>>16&63, n>>8&255, n&255)
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	if err := c.Status().Update(ctx, pod); err != nil {
		return nil, fmt.Errorf("writing the status of Pod %s: %w", pod.Name, err)
	}
	return pod, nil
}

// makeFleet creates the Nodes, the resources, a pod of every
// resource on every node and its slice.
func makeFleet(ctx context.Context, c client.Client, o options, ns string) ([]*corev1.Node, error) {
	start := time.Now()
	nodes := make([]*corev1.Node, o.nodes)
	if err := parallel(o.nodes, o.writers, func(i int) error {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName(i)}}
		if err := c.Create(ctx, n); err != nil {
			return fmt.Errorf("creating Node %s: %w", n.Name, err)
		}
		nodes[i] = n
		return nil
	}); err != nil {
		return nil, err
	}
	uids := make([]types.UID, o.resources)
	for i := range o.resources {
		r := resource(ns, resourceName(i))
		if err := c.Create(ctx, r); err != nil {
			return nil, fmt.Errorf("creating %s: %w", r.Name, err)
		}
		uids[i] = r.UID
	}
	if err := parallel(o.resources*o.nodes, o.writers, func(i int) error {
		ri, ni := i%o.resources, i/o.resources
		pod, err := fleetPod(ctx, c, ns, ri, ni)
		if err != nil {
			return err
		}
		s := agentSlice(ns, resourceName(ri), uids[ri], pod)
		if err := c.Create(ctx, s); err != nil {
			return fmt.Errorf("creating EndpointSlice %s: %w", s.Name, err)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "fleet:   %d Nodes, %d resources, %d pods and their slices made in %s\n", o.nodes, o.resources, o.nodes*o.resources,
		time.Since(start).Round(time.Second))
	return nodes, nil
}

// republish writes the slices of the nodes ready again, as their returning agents would.
func republish(ctx context.Context, c client.Client, o options, ns string, nodes []int) error {
	return parallel(len(nodes)*o.resources, o.writers, func(i int) error {
		ri, ni := i%o.resources, nodes[i/o.resources]
		key := slicemeta.SliceKey{Resource: resourceName(ri), Port: "http", Node: nodeName(ni)}
		want := client.ObjectKey{Namespace: ns, Name: key.Name()}
		for {
			var cur discoveryv1.EndpointSlice
			if err := c.Get(ctx, want, &cur); err != nil {
				return fmt.Errorf("reading EndpointSlice %s: %w", want.Name, err)
			}
			for j := range cur.Endpoints {
				cur.Endpoints[j].Conditions = readyConditions()
			}
			err := c.Update(ctx, &cur)
			if apierrors.IsConflict(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("republishing EndpointSlice %s: %w", want.Name, err)
			}
			return nil
		}
	})
}

// renewer renews every node's agent Lease on the agents' schedule: node i at offset
// i·period/N into each period, so the renewals spread evenly over the period as real agents'
// do. Each Lease is owned by its Node, like an agent's.
type renewer struct {
	c      client.Client
	period time.Duration

	mu      sync.Mutex
	lastOK  []time.Time
	stops   []context.CancelFunc
	maxLag  time.Duration
	renewed int
	failed  int
	wg      sync.WaitGroup
}

// startRenewer creates the Leases and starts renewing them until ctx ends or stop.
func startRenewer(ctx context.Context, c client.Client, o options, nodes []*corev1.Node) (*renewer, error) {
	r := &renewer{c: c, period: o.renew, lastOK: make([]time.Time, len(nodes)), stops: make([]context.CancelFunc, len(nodes))}
	leases := make([]*coordinationv1.Lease, len(nodes))
	if err := parallel(len(nodes), o.writers, func(i int) error {
		n := nodes[i]
		now := metav1.NewMicroTime(time.Now())
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: leaseNamespace, Name: wellknown.AgentLeaseName(n.Name),
				Annotations:     map[string]string{wellknown.AnnotationNode: n.Name},
				Labels:          map[string]string{wellknown.LabelNode: n.Name},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}},
			},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(n.Name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
		}
		if err := c.Create(ctx, l); err != nil {
			return fmt.Errorf("creating Lease %s: %w", l.Name, err)
		}
		leases[i] = l
		r.lastOK[i] = time.Now()
		return nil
	}); err != nil {
		return nil, err
	}
	start := time.Now()
	for i, l := range leases {
		nodeCtx, cancel := context.WithCancel(ctx)
		r.stops[i] = cancel
		offset := time.Duration(int64(o.renew) * int64(i) / int64(len(leases)))
		r.wg.Go(func() { r.run(nodeCtx, i, l, start.Add(offset)) })
	}
	return r, nil
}

// run renews one Lease at next, next+period, ... until ctx ends.
func (r *renewer) run(ctx context.Context, i int, l *coordinationv1.Lease, next time.Time) {
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		lag := time.Since(next)
		err := r.renewOnce(ctx, l)
		r.mu.Lock()
		if err == nil {
			r.lastOK[i] = time.Now()
			r.renewed++
			r.maxLag = max(r.maxLag, lag)
		} else if ctx.Err() == nil {
			r.failed++
		}
		r.mu.Unlock()
		next = next.Add(r.period)
		timer.Reset(time.Until(next))
	}
}

// renewOnce writes a new renewTime, re-reading the Lease after a conflict.
func (r *renewer) renewOnce(ctx context.Context, l *coordinationv1.Lease) error {
	for range 3 {
		l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
		err := r.c.Update(ctx, l)
		if !apierrors.IsConflict(err) {
			return err
		}
		if err := r.c.Get(ctx, client.ObjectKeyFromObject(l), l); err != nil {
			return err
		}
	}
	return errors.New("lost three write races in a row")
}

// stop ends the renewals of the nodes and returns the latest of their last successful renewals.
func (r *renewer) stop(nodes []int) time.Time {
	for _, i := range nodes {
		r.stops[i]()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var last time.Time
	for _, i := range nodes {
		if r.lastOK[i].After(last) {
			last = r.lastOK[i]
		}
	}
	return last
}

// resume starts renewing the nodes' Leases again, right away.
func (r *renewer) resume(ctx context.Context, nodes []int) error {
	for _, i := range nodes {
		var l coordinationv1.Lease
		if err := r.c.Get(ctx, client.ObjectKey{Namespace: leaseNamespace, Name: wellknown.AgentLeaseName(nodeName(i))}, &l); err != nil {
			return fmt.Errorf("reading Lease of %s: %w", nodeName(i), err)
		}
		nodeCtx, cancel := context.WithCancel(ctx)
		r.stops[i] = cancel
		r.wg.Go(func() { r.run(nodeCtx, i, &l, time.Now()) })
	}
	return nil
}

// stats are the renewals so far: how many succeeded and failed, and the latest one was late by.
func (r *renewer) stats() (renewed, failed int, maxLag time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.renewed, r.failed, r.maxLag
}

// close stops every renewal and waits for them.
func (r *renewer) close() {
	for _, s := range r.stops {
		s()
	}
	r.wg.Wait()
}
