package agent

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/coalesce"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/credentials"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/publisher"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/scheduler"
	agentslices "github.com/deckhouse/service-with-healthchecks/images/agent/internal/slices"
)

// MaxRetryDelay bounds the backoff of a resource whose reconcile failed.
const MaxRetryDelay = 30 * time.Second

// Event reasons of probe transitions.
const (
	ReasonPortReady    = "PortReady"
	ReasonPortNotReady = "PortNotReady"
)

// Scheme knows the built-in types and the module's.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// Reconciler reconciles one ServiceWithHealthchecks on this node: it declares the probe
// targets of the node's selected pods, applies the per-port rule to their results, and
// publishes the resulting slices.
type Reconciler struct {
	Client      client.Client
	Reader      client.Reader
	Node        string
	Scheduler   *scheduler.Scheduler
	Publisher   *publisher.Publisher
	Recorder    events.EventRecorder
	Credentials *credentials.Store
	Metrics     *metrics.Metrics
	Log         logr.Logger
	// Window coalesces result changes (leading-edge, see enqueueChange).
	Window time.Duration

	mu        sync.Mutex
	queue     workqueue.TypedRateLimitingInterface[reconcile.Request]
	coalescer *coalesce.Coalescer[types.NamespacedName]
	zone      *string
	refs      map[types.NamespacedName][]types.NamespacedName
	endpoints map[types.NamespacedName]map[string]int
	serving   map[types.NamespacedName]map[string]bool
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.refs = map[types.NamespacedName][]types.NamespacedName{}
	r.endpoints = map[types.NamespacedName]map[string]int{}
	r.serving = map[types.NamespacedName]map[string]bool{}
	r.coalescer = coalesce.New[types.NamespacedName](r.Window, nil)
	err := ctrl.NewControllerManagedBy(mgr).
		Named("agent").
		// Failed writes (an API outage) are retried at most 30 s apart, so the agent publishes
		// soon after the API server is back, not after controller-runtime's 16-minute maximum.
		WithOptions(controller.Options{RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](100*time.Millisecond, MaxRetryDelay)}).
		For(&v1alpha1.ServiceWithHealthchecks{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.resourcesOfPod)).
		Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(r.resourceOfSlice)).
		WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			r.mu.Lock()
			r.queue = q
			r.mu.Unlock()
			return nil
		})).
		Complete(r)
	if err != nil {
		return fmt.Errorf("creating the agent controller: %w", err)
	}
	return nil
}

// resultChanged is the scheduler's OnChange: it enqueues the resource with leading-edge
// coalescing (see enqueueChange).
func (r *Reconciler) resultChanged(c scheduler.Change) {
	r.enqueueChange(c.Key.Resource)
}

// secretChanged re-evaluates the resources that reference a credential Secret.
func (r *Reconciler) secretChanged(secret types.NamespacedName) {
	r.mu.Lock()
	var hit []types.NamespacedName
	for res, refs := range r.refs {
		if slices.Contains(refs, secret) {
			hit = append(hit, res)
		}
	}
	r.mu.Unlock()
	for _, res := range hit {
		r.enqueueChange(res)
	}
}

// enqueueChange enqueues the resource of a change, coalescing leading-edge: a change of a
// resource not queued within the last window is queued at once; the changes that follow within
// the window are queued together when the window since the last queueing ends (the work queue
// keeps one entry per resource and the earliest time). A burst makes at most two reconciles
// (and two writes per slice) per window, a flap storm about one per window.
func (r *Reconciler) enqueueChange(res types.NamespacedName) {
	r.mu.Lock()
	q := r.queue
	r.mu.Unlock()
	if q == nil {
		return
	}
	req := reconcile.Request{NamespacedName: res}
	if d := r.coalescer.Next(res); d > 0 {
		q.AddAfter(req, d)
	} else {
		q.Add(req)
	}
}

func (r *Reconciler) resourcesOfPod(ctx context.Context, o client.Object) []reconcile.Request {
	pod, ok := o.(*corev1.Pod)
	if !ok || pod.Spec.NodeName != r.Node {
		return nil
	}
	var list v1alpha1.ServiceWithHealthchecksList
	if err := r.Client.List(ctx, &list, client.InNamespace(pod.Namespace)); err != nil {
		r.Log.Error(err, "listing resources for a pod", "pod", client.ObjectKeyFromObject(pod))
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		swh := &list.Items[i]
		if selects(swh, pod) || r.hasTargets(swh) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(swh)})
		}
	}
	return out
}

// hasTargets tells whether the agent publishes anything for the resource, so a pod whose
// labels stop matching is still withdrawn.
func (r *Reconciler) hasTargets(swh *v1alpha1.ServiceWithHealthchecks) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.endpoints[client.ObjectKeyFromObject(swh)]) > 0
}

func (r *Reconciler) resourceOfSlice(_ context.Context, o client.Object) []reconcile.Request {
	s, ok := o.(*discoveryv1.EndpointSlice)
	if !ok || slicemeta.NodeOf(s) != r.Node || s.Labels[slicemeta.LabelResource] == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: s.Namespace, Name: s.Labels[slicemeta.LabelResource]}}}
}

func selects(swh *v1alpha1.ServiceWithHealthchecks, pod *corev1.Pod) bool {
	if len(swh.Spec.Selector) == 0 || swh.Namespace != pod.Namespace {
		return false
	}
	return labels.SelectorFromSet(swh.Spec.Selector).Matches(labels.Set(pod.Labels))
}

// Reconcile computes and publishes the slices of one resource on this node.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := r.Log.WithValues("swh", req.NamespacedName)
	swh := &v1alpha1.ServiceWithHealthchecks{}
	if err := r.Client.Get(ctx, req.NamespacedName, swh); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, fmt.Errorf("reading the resource: %w", err)
		}
		swh = nil
	}
	if swh == nil || swh.DeletionTimestamp != nil {
		// The controller removes the slices of deleted resources; the agent only stops probing.
		r.forget(req.NamespacedName)
		return reconcile.Result{}, nil
	}

	var podList corev1.PodList
	if err := r.Client.List(ctx, &podList, client.InNamespace(swh.Namespace)); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing pods: %w", err)
	}
	var pods []*corev1.Pod
	for i := range podList.Items {
		p := &podList.Items[i]
		if p.Spec.NodeName == r.Node && selects(swh, p) {
			pods = append(pods, p)
		}
	}
	slices.SortFunc(pods, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })

	r.Scheduler.Set(req.NamespacedName, Targets(swh, pods))
	r.setRefs(req.NamespacedName, pods, swh)

	evaluated := make([]agentslices.Pod, 0, len(pods))
	for _, p := range pods {
		eps := portrule.Evaluate(&swh.Spec, p, r.Scheduler.Results(req.NamespacedName, p.UID))
		evaluated = append(evaluated, agentslices.Pod{Pod: p, Endpoints: eps})
	}

	// What this agent published before, for carry-over, and every slice the names may hit.
	var sliceList discoveryv1.EndpointSliceList
	if err := r.Client.List(ctx, &sliceList, client.InNamespace(swh.Namespace),
		client.MatchingLabels{slicemeta.LabelResource: swh.Name}); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing EndpointSlices: %w", err)
	}
	existing := map[string]*discoveryv1.EndpointSlice{}
	var own []*discoveryv1.EndpointSlice
	for i := range sliceList.Items {
		s := &sliceList.Items[i]
		if slicemeta.NodeOf(s) != r.Node {
			continue
		}
		existing[s.Name] = s
		if slicemeta.IsManaged(s) {
			own = append(own, s)
		}
	}
	desired := agentslices.Compute(agentslices.Input{
		Resource: swh, Node: r.Node, Zone: r.nodeZone(ctx, log), Pods: evaluated, Existing: own,
	})
	keys := map[string]slicemeta.SliceKey{}
	for _, d := range desired {
		keys[d.Slice.Name] = d.Key
		if _, ok := existing[d.Slice.Name]; ok {
			continue
		}
		// A managed slice of another resource (or node) may hold the name: the cache has it.
		held := &discoveryv1.EndpointSlice{}
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: swh.Namespace, Name: d.Slice.Name}, held)
		switch {
		case err == nil:
			existing[held.Name] = held
		case !apierrors.IsNotFound(err):
			return reconcile.Result{}, fmt.Errorf("reading EndpointSlice %s: %w", d.Slice.Name, err)
		}
	}
	plan := agentslices.Diff(swh.Name, swh.UID, r.Node, desired, existing)
	r.record(swh, evaluated, desired)
	if !plan.HasChanges() && len(plan.Conflicts) == 0 {
		return reconcile.Result{}, nil
	}
	log.V(1).Info("publishing", "create", len(plan.Create), "update", len(plan.Update), "delete", len(plan.Delete), "conflicts", len(plan.Conflicts))
	if _, err := r.Publisher.Apply(ctx, swh, plan, keys); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, nil
}

// Targets are the probe targets of a resource's pods on this node: every probe of every pod
// that has an IP and is not in a terminal phase, and whose probe port resolves on the pod.
func Targets(swh *v1alpha1.ServiceWithHealthchecks, pods []*corev1.Pod) []scheduler.Target {
	if swh.Spec.Healthcheck == nil || len(swh.Spec.Healthcheck.Probes) == 0 {
		return nil
	}
	hc := swh.Spec.Healthcheck
	period := time.Duration(max(hc.PeriodSeconds, 1)) * time.Second
	res := client.ObjectKeyFromObject(swh)
	var out []scheduler.Target
	for _, pod := range pods {
		if pod.Status.PodIP == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		started := pod.CreationTimestamp.Time
		if pod.Status.StartTime != nil {
			started = pod.Status.StartTime.Time
		}
		for i, p := range hc.Probes {
			port, ok := portrule.ResolveProbePort(pod, p)
			if !ok {
				continue
			}
			// Probes dial the pod's primary address; the verdict covers every family.
			out = append(out, scheduler.Target{
				Key:       scheduler.NewKey(res, pod.UID, i, p, pod.Status.PodIP, port, period),
				Probe:     p,
				Namespace: pod.Namespace,
				PodName:   pod.Name,
				PodIP:     pod.Status.PodIP,
				Port:      port,
				NotBefore: started.Add(time.Duration(hc.InitialDelaySeconds) * time.Second),
				Period:    period,
			})
		}
	}
	return out
}

// forget drops everything the agent keeps for a resource.
func (r *Reconciler) forget(res types.NamespacedName) {
	r.Scheduler.Set(res, nil)
	r.coalescer.Forget(res)
	r.mu.Lock()
	delete(r.refs, res)
	delete(r.endpoints, res)
	delete(r.serving, res)
	r.publishGaugesLocked()
	refs := r.allRefsLocked()
	r.mu.Unlock()
	if r.Credentials != nil {
		r.Credentials.SetReferences(refs)
	}
}

func (r *Reconciler) setRefs(res types.NamespacedName, pods []*corev1.Pod, swh *v1alpha1.ServiceWithHealthchecks) {
	var refs []types.NamespacedName
	if len(pods) > 0 {
		refs = refsOf(swh)
	}
	r.mu.Lock()
	changed := !slices.Equal(r.refs[res], refs)
	if len(refs) == 0 {
		delete(r.refs, res)
	} else {
		r.refs[res] = refs
	}
	all := r.allRefsLocked()
	r.mu.Unlock()
	if changed && r.Credentials != nil {
		r.Credentials.SetReferences(all)
	}
}

func (r *Reconciler) allRefsLocked() []types.NamespacedName {
	set := map[types.NamespacedName]struct{}{}
	for _, refs := range r.refs {
		for _, ref := range refs {
			set[ref] = struct{}{}
		}
	}
	return slices.Collect(maps.Keys(set))
}

// record updates the endpoint gauges and records an Event when a decided port of a pod changes
// between serving and not serving ("pod db-1, port postgres: query returned false").
func (r *Reconciler) record(swh *v1alpha1.ServiceWithHealthchecks, pods []agentslices.Pod, desired []agentslices.Desired) {
	res := client.ObjectKeyFromObject(swh)
	counts := map[string]int{}
	for _, d := range desired {
		for _, e := range d.Slice.Endpoints {
			switch {
			case *e.Conditions.Terminating:
				counts[metrics.StateTerminating]++
			case *e.Conditions.Ready:
				counts[metrics.StateReady]++
			default:
				counts[metrics.StateNotReady]++
			}
		}
	}
	type event struct {
		pod   *corev1.Pod
		ready bool
		msg   string
	}
	var evs []event
	r.mu.Lock()
	prev := r.serving[res]
	next := map[string]bool{}
	for _, p := range pods {
		for _, e := range p.Endpoints {
			if !e.Published || !e.Decided || len(e.Probes) == 0 {
				continue
			}
			portName := swh.Spec.Ports[e.PortIndex].Name
			if portName == "" {
				portName = fmt.Sprint(swh.Spec.Ports[e.PortIndex].Port)
			}
			k := string(p.Pod.UID) + "/" + portName
			next[k] = e.Serving
			was, seen := prev[k]
			switch {
			case seen && was == e.Serving:
			case e.Serving && seen:
				evs = append(evs, event{p.Pod, true, fmt.Sprintf("pod %s, port %s: probes pass", p.Pod.Name, portName)})
			case !e.Serving:
				evs = append(evs, event{p.Pod, false, fmt.Sprintf("pod %s, port %s: %s", p.Pod.Name, portName, e.Reason)})
			}
		}
	}
	r.serving[res] = next
	if len(counts) == 0 {
		delete(r.endpoints, res)
	} else {
		r.endpoints[res] = counts
	}
	r.publishGaugesLocked()
	r.mu.Unlock()
	// The pod is the Event's related object. The recorder aggregates Events with the same
	// regarding and related object, type, reason and action into one Event with a series
	// (that is the rate limit, see development/AGENT.md); without the pod, one pod's transition
	// would be counted in another pod's Event and its message never shown.
	for _, ev := range evs {
		if ev.ready {
			r.Recorder.Eventf(swh, ev.pod, corev1.EventTypeNormal, ReasonPortReady, "Probe", "%s", ev.msg)
		} else {
			r.Recorder.Eventf(swh, ev.pod, corev1.EventTypeWarning, ReasonPortNotReady, "Probe", "%s", ev.msg)
		}
	}
}

func (r *Reconciler) publishGaugesLocked() {
	total := map[string]int{}
	for _, c := range r.endpoints {
		for k, v := range c {
			total[k] += v
		}
	}
	for _, s := range []string{metrics.StateReady, metrics.StateNotReady, metrics.StateTerminating} {
		r.Metrics.Endpoints.WithLabelValues(s).Set(float64(total[s]))
	}
}

// nodeZone reads the node's zone once (topology.kubernetes.io/zone). It is read with a plain
// GET, not a watch: topology labels do not change while a node runs, and an agent that may not
// read its Node still publishes, without a zone.
func (r *Reconciler) nodeZone(ctx context.Context, log logr.Logger) string {
	r.mu.Lock()
	z := r.zone
	r.mu.Unlock()
	if z != nil {
		return *z
	}
	node := &corev1.Node{}
	zone := ""
	if err := r.Reader.Get(ctx, client.ObjectKey{Name: r.Node}, node); err != nil {
		if !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
			log.Error(err, "reading the node's zone; trying again at the next reconcile")
			return ""
		}
		log.Info("publishing endpoints without a zone: the node cannot be read", "node", r.Node, "error", err.Error())
	} else {
		zone = node.Labels[corev1.LabelTopologyZone]
	}
	r.mu.Lock()
	r.zone = &zone
	r.mu.Unlock()
	return zone
}
