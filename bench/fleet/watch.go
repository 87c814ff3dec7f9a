// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// watcher follows the resources and our slices with informers (list, then watch, re-watching
// when a watch ends) opened before anything is measured, and times when each object first
// meets a goal.
type watcher struct {
	mu       sync.Mutex
	goals    []*goal
	resStore cache.Store
	slcStore cache.Store
}

// goal is "every one of want objects meets pred": at records when each first did.
type goal struct {
	name  string
	kind  string // "resource" or "slice"
	pred  func(obj any) bool
	want  int
	at    map[string]time.Time
	since time.Time
	done  chan struct{}
}

func startWatcher(ctx context.Context, cs kubernetes.Interface, dyn dynamic.Interface) (*watcher, error) {
	w := &watcher{}
	slices := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.LabelSelector = discoveryv1.LabelManagedBy + "=" + wellknown.ManagedBy
	}))
	si := slices.Discovery().V1().EndpointSlices().Informer()
	if _, err := si.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { w.saw("slice", obj) }, UpdateFunc: func(_, obj any) { w.saw("slice", obj) },
	}); err != nil {
		return nil, fmt.Errorf("slice informer: %w", err)
	}
	resources := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	ri := resources.ForResource(v1alpha1.GroupVersion.WithResource("servicewithhealthchecks")).Informer()
	if _, err := ri.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { w.saw("resource", obj) }, UpdateFunc: func(_, obj any) { w.saw("resource", obj) },
	}); err != nil {
		return nil, fmt.Errorf("resource informer: %w", err)
	}
	w.slcStore, w.resStore = si.GetStore(), ri.GetStore()
	slices.Start(ctx.Done())
	resources.Start(ctx.Done())
	for typ, ok := range slices.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("informer for %v did not sync", typ)
		}
	}
	for typ, ok := range resources.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("informer for %v did not sync", typ)
		}
	}
	return w, nil
}

// asResource converts what the dynamic informer holds.
func asResource(obj any) (*v1alpha1.ServiceWithHealthchecks, bool) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, false
	}
	var swh v1alpha1.ServiceWithHealthchecks
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &swh); err != nil {
		return nil, false
	}
	return &swh, true
}

func (w *watcher) saw(kind string, obj any) {
	var key string
	switch kind {
	case "slice":
		s, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			return
		}
		key, obj = s.Namespace+"/"+s.Name, s
	default:
		swh, ok := asResource(obj)
		if !ok {
			return
		}
		key, obj = swh.Namespace+"/"+swh.Name, swh
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, g := range w.goals {
		g.check(kind, key, obj, now)
	}
}

func (g *goal) check(kind, key string, obj any, now time.Time) {
	if g.kind != kind || !g.pred(obj) {
		return
	}
	if _, seen := g.at[key]; seen {
		return
	}
	g.at[key] = now
	if len(g.at) == g.want {
		close(g.done)
	}
}

// expect starts timing a goal. Objects that already meet it count as meeting it now.
func (w *watcher) expect(name, kind string, want int, pred func(obj any) bool) *goal {
	g := &goal{name: name, kind: kind, pred: pred, want: want, at: map[string]time.Time{}, since: time.Now(), done: make(chan struct{})}
	if want == 0 {
		close(g.done)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.goals = append(w.goals, g)
	store := w.resStore
	if kind == "slice" {
		store = w.slcStore
	}
	for _, obj := range store.List() {
		if kind == "resource" {
			swh, ok := asResource(obj)
			if !ok {
				continue
			}
			g.check(kind, swh.Namespace+"/"+swh.Name, swh, g.since)
			continue
		}
		if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
			g.check(kind, s.Namespace+"/"+s.Name, s, g.since)
		}
	}
	return g
}

// wait waits until the goal is met, or fails; it returns when the last object met it.
func (w *watcher) wait(ctx context.Context, g *goal, failed <-chan struct{}, failure func() error) (time.Time, error) {
	select {
	case <-g.done:
	case <-failed:
		return time.Time{}, failure()
	case <-ctx.Done():
		w.mu.Lock()
		defer w.mu.Unlock()
		return time.Time{}, fmt.Errorf("%s: %d of %d after %s", g.name, len(g.at), g.want, time.Since(g.since).Round(time.Second))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.goals = deleteGoal(w.goals, g)
	var last time.Time
	for _, at := range g.at {
		if at.After(last) {
			last = at
		}
	}
	return last, nil
}

func deleteGoal(goals []*goal, g *goal) []*goal {
	out := goals[:0]
	for _, x := range goals {
		if x != g {
			out = append(out, x)
		}
	}
	return out
}

// withdrawn tells whether every endpoint of the slice is ready=false and serving=false.
func withdrawn(s *discoveryv1.EndpointSlice) bool {
	for _, e := range s.Endpoints {
		c := e.Conditions
		if c.Ready == nil || *c.Ready || c.Serving == nil || *c.Serving {
			return false
		}
	}
	return len(s.Endpoints) > 0
}

// conditionIs tells whether the resource has the condition with the status (and reason, if set)
// for its current generation.
func conditionIs(swh *v1alpha1.ServiceWithHealthchecks, typ string, status metav1.ConditionStatus, reason string) bool {
	c := meta.FindStatusCondition(swh.Status.Conditions, typ)
	return c != nil && c.Status == status && (reason == "" || c.Reason == reason) && c.ObservedGeneration == swh.Generation
}

// endpoints tells whether the resource's only port counts ready of total endpoints.
func endpoints(swh *v1alpha1.ServiceWithHealthchecks, ready, total int) bool {
	return len(swh.Status.Ports) == 1 && int(swh.Status.Ports[0].ReadyEndpoints) == ready && int(swh.Status.Ports[0].TotalEndpoints) == total
}
