// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// A traffic loop counts its requests only from the moment its Service can answer: kube-proxy
// routes the ClusterIP (of the loop's family) to exactly the endpoints the view shows in (the
// ready endpoints of the Service port's slices), and there is at least one. Before that the
// loop is in its start-up and its line says what it waits for; a request that fails after it
// is counted like any other (development/RUN.md, "The view").

// gatePoll is how often a loop in its start-up looks at the slices and kube-proxy's rules.
const gatePoll = 200 * time.Millisecond

// startUp waits until the loop's Service can answer; it records what it waits for (for the
// view) and, at the end, the moment counting starts. It returns false when ctx ended first.
func (l *loop) startUp(ctx context.Context) bool {
	for {
		waiting, err := l.d.answering(ctx, l)
		if ctx.Err() != nil {
			return false
		}
		if err != nil {
			waiting = err.Error()
		}
		l.mu.Lock()
		if waiting == "" {
			l.countFrom = time.Now()
			l.waiting = ""
			l.mu.Unlock()
			return true
		}
		l.waiting = waiting
		l.mu.Unlock()
		sleep(ctx, gatePoll)
	}
}

// answering tells what the loop's Service still waits for before it can answer ("" when
// nothing): an endpoint published ready, then kube-proxy routing the ClusterIP to exactly the
// ready endpoints.
func (d *demo) answering(ctx context.Context, l *loop) (string, error) {
	var svc corev1.Service
	if err := d.c.Env.Client.Get(ctx, client.ObjectKey{Namespace: demoNamespace, Name: l.service}, &svc); err != nil {
		if apierrors.IsNotFound(err) {
			return "waiting for the controller to create Service " + l.service, nil
		}
		return "", fmt.Errorf("reading Service %s: %w", l.service, err)
	}
	family := l.family
	if family == "" && len(svc.Spec.IPFamilies) > 0 {
		family = svc.Spec.IPFamilies[0]
	}
	if family == "" {
		family = corev1.IPv4Protocol
	}
	var portName string
	found := false
	for _, p := range svc.Spec.Ports {
		if p.Port == l.port {
			portName, found = p.Name, true
		}
	}
	if !found {
		return fmt.Sprintf("waiting for Service %s to have port %d", l.service, l.port), nil
	}
	var list discoveryv1.EndpointSliceList
	if err := d.c.Env.Client.List(ctx, &list, client.InNamespace(demoNamespace), client.MatchingLabels{
		discoveryv1.LabelServiceName: l.service, discoveryv1.LabelManagedBy: wellknown.ManagedBy,
	}); err != nil {
		return "", fmt.Errorf("listing the slices of %s: %w", l.service, err)
	}
	published := readyEndpoints(list.Items, portName, family)
	if len(published) == 0 {
		return "waiting for a pod published ready (the first probes)", nil
	}
	programmed, err := d.c.ProgrammedEndpointsOf(ctx, demoNamespace+"/"+l.service, l.port, family)
	if err != nil {
		return "", fmt.Errorf("reading %s's rules for %s: %w", d.c.Dataplane(), l.service, err)
	}
	if !slices.Equal(programmed, published) {
		has := "none"
		if len(programmed) > 0 {
			has = strings.Join(programmed, ", ")
		}
		return fmt.Sprintf("waiting for %s to route it to %s (it routes to %s)", d.c.Dataplane(), strings.Join(published, ", "), has), nil
	}
	return "", nil
}

// readyEndpoints are the "ip:port" (IPv6 bracketed, sorted, each once) of the ready endpoints
// of the address family in the slices' port portName: what kube-proxy routes a Service port to.
func readyEndpoints(slcs []discoveryv1.EndpointSlice, portName string, family corev1.IPFamily) []string {
	seen := map[string]bool{}
	for _, s := range slcs {
		if string(s.AddressType) != string(family) {
			continue
		}
		for _, p := range s.Ports {
			if p.Port == nil || (p.Name == nil && portName != "") || (p.Name != nil && *p.Name != portName) {
				continue
			}
			for _, e := range s.Endpoints {
				// As kube-proxy reads it: no condition is ready.
				if e.Conditions.Ready != nil && !*e.Conditions.Ready {
					continue
				}
				for _, a := range e.Addresses {
					seen[net.JoinHostPort(a, strconv.Itoa(int(*p.Port)))] = true
				}
			}
		}
	}
	out := make([]string, 0, len(seen))
	for ep := range seen {
		out = append(out, ep)
	}
	slices.Sort(out)
	return out
}
