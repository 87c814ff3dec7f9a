// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/controller/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

// env is the one control plane of this package; every test works in a namespace of its own.
var env *controlplane.Env

const (
	wait = 30 * time.Second
	tick = 50 * time.Millisecond
)

// TestMain runs the tests with the informer-cache mutation detector on: the reconciler lists
// slices without copies.
func TestMain(m *testing.M) {
	controlplane.DetectCacheMutations()
	controlplane.Main(m, controlplane.Options{}, &env)
}

// running is a controller started by a test.
type running struct {
	metrics *metrics.Metrics
	mgr     ctrl.Manager
	stop    func()
}

// startController starts a controller whose informers see only namespace ns. mutate adjusts the
// options (leader election, field manager). It stops when the test ends, or on stop().
func startController(t *testing.T, ns string, mutate func(*Options)) *running {
	t.Helper()
	return startControllerOn(t, env.Config, ns, mutate)
}

// startControllerOn is startController talking to the API server through cfg.
func startControllerOn(t *testing.T, cfg *rest.Config, ns string, mutate func(*Options)) *running {
	t.Helper()
	log := logr.Discard()
	if os.Getenv("SWH_TEST_LOG") == "1" {
		log = zap.New(zap.UseDevMode(true), zap.WriteTo(os.Stderr))
	}
	o := Options{
		MetricsBindAddress:     "0",
		HealthProbeBindAddress: "0",
		Namespaces:             []string{ns},
		Registry:               prometheus.NewRegistry(),
		SkipNameValidation:     true,
		Logger:                 log,
		SkipAudit:              true, // Their slices name no Pods; the Forged tests turn it on.
	}
	if mutate != nil {
		mutate(&o)
	}
	mgr, m, err := NewManager(cfg, o)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller stopped with an error: %v", err)
		}
	}
	t.Cleanup(stop)
	return &running{metrics: m, mgr: mgr, stop: stop}
}

func (r *running) reconciles() float64 {
	return testutil.ToFloat64(r.metrics.Reconciles.WithLabelValues(metrics.ResultSuccess)) +
		testutil.ToFloat64(r.metrics.Reconciles.WithLabelValues(metrics.ResultError)) +
		testutil.ToFloat64(r.metrics.Reconciles.WithLabelValues(metrics.ResultRequeue))
}

func (r *running) serviceWrites() float64 {
	var sum float64
	for _, op := range []string{metrics.OpCreate, metrics.OpApply, metrics.OpUpgradeFields, metrics.OpClearSelector, metrics.OpDeleteService} {
		sum += testutil.ToFloat64(r.metrics.ServiceWrites.WithLabelValues(op))
	}
	return sum
}

// newResource returns a resource with two named ports; mutate adjusts it.
func newResource(ns, name string, mutate func(*v1alpha1.ServiceWithHealthchecks)) *v1alpha1.ServiceWithHealthchecks {
	swh := &v1alpha1.ServiceWithHealthchecks{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.ServiceWithHealthchecksSpec{
			Selector: map[string]string{"app": name},
			Ports: []v1alpha1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
				// The typed client cannot omit targetPort (the API type is not a pointer), so every
				// port names one.
				{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9090, TargetPort: intstr.FromInt32(9090)},
			},
		},
	}
	if mutate != nil {
		mutate(swh)
	}
	return swh
}

func create(t *testing.T, obj client.Object) {
	t.Helper()
	require.NoError(t, env.Client.Create(t.Context(), obj))
}

// eventually polls get until check passes and returns the last object.
func eventually[T client.Object](t *testing.T, obj T, check func(*assert.CollectT, T), msg string) T {
	t.Helper()
	key := client.ObjectKeyFromObject(obj)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		if !assert.NoError(c, env.Client.Get(t.Context(), key, obj)) {
			return
		}
		check(c, obj)
	}, wait, tick, msg)
	return obj
}

func service(ns, name string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
}

func gone(t *testing.T, obj client.Object, msg string) {
	t.Helper()
	key := client.ObjectKeyFromObject(obj)
	require.Eventually(t, func() bool {
		err := env.Client.Get(t.Context(), key, obj.DeepCopyObject().(client.Object))
		return apierrors.IsNotFound(err)
	}, wait, tick, msg)
}

// countsTo waits until counter c reads want. The controller counts a deletion after the API
// server's answer, and a test polling for the object can see it gone first.
func countsTo(t *testing.T, c prometheus.Counter, want float64) {
	t.Helper()
	// EventuallyWithT reports the value of the last poll; a message's arguments are read once,
	// before the wait.
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.Equal(ct, want, testutil.ToFloat64(c), "the counter")
	}, wait, tick)
}

func condition(swh *v1alpha1.ServiceWithHealthchecks, typ string) metav1.Condition {
	for _, c := range swh.Status.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return metav1.Condition{}
}

// node creates a Node that the test deletes at its end.
func node(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	create(t, n)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), n) })
	return n
}

type sliceOpt func(*discoveryv1.EndpointSlice)

// slice creates an EndpointSlice the way the agent publishes it, for resource swh (name and UID).
func slice(t *testing.T, ns, resource string, uid types.UID, port, nodeName string, opts ...sliceOpt) *discoveryv1.EndpointSlice {
	t.Helper()
	s := newSlice(ns, resource, uid, port, nodeName, opts...)
	create(t, s)
	return s
}

// newSlice is the slice that slice creates, not created yet.
func newSlice(ns, resource string, uid types.UID, port, nodeName string, opts ...sliceOpt) *discoveryv1.EndpointSlice {
	key := slicemeta.SliceKey{Resource: resource, Port: port, Node: nodeName}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: key.Name(), Namespace: ns, Labels: key.Labels(), Annotations: key.Annotations(),
			OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference(resource, uid)},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"10.1.0.5"},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(nodeName),
		}},
		// The target port of newResource's port of that name (the audit checks it).
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To(port), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(targetPortOf(port))}},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// targetPortOf is the target port of newResource's port of that name: 9090 for metrics, 8080
// otherwise.
func targetPortOf(port string) int32 {
	if port == "metrics" {
		return 9090
	}
	return 8080
}

func named(name string) sliceOpt { return func(s *discoveryv1.EndpointSlice) { s.Name = name } }

func managedBy(v string) sliceOpt {
	return func(s *discoveryv1.EndpointSlice) { s.Labels[discoveryv1.LabelManagedBy] = v }
}

// events lists the Events recorded about the object named name in ns with the given reason.
func eventsAbout(t *testing.T, ns, name, reason string) []eventsv1.Event {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, env.Client.List(t.Context(), &list, client.InNamespace(ns)))
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Name == name && e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// update reads obj, applies change and writes it, again when a write of the controller came
// in between.
func update[T client.Object](t *testing.T, obj T, change func(T)) {
	t.Helper()
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		change(obj)
		return env.Client.Update(t.Context(), obj)
	}))
}
