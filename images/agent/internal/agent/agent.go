// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package agent wires the agent together: a controller-runtime manager whose caches hold only
// this node's pods (and this module's EndpointSlices), the probe scheduler, the per-port rule,
// the desired-slice computation and the publisher. cmd/agent only parses flags and calls Run.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/credentials"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/lease"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/prober"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/publisher"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/scheduler"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/sliceplan"
	"github.com/deckhouse/service-with-healthchecks/lib/eventnote"
)

// Defaults of the options (and of the program's flags).
const (
	DefaultMetricsBindAddress     = "127.0.0.1:9781"
	DefaultHealthProbeBindAddress = "127.0.0.1:9782"
	DefaultLeaseNamespace         = wellknown.Namespace
	DefaultProbeConcurrency       = 64
	// DefaultMaxProbeTargets is the default probe budget (development/AGENT.md, "Probe
	// budget"): well within the agent's 512 MiB memory limit (development/BENCHMARKS.md).
	DefaultMaxProbeTargets = 20000
	DefaultCoalesceWindow  = 200 * time.Millisecond
	DefaultCoalesceBurst   = 3
	// ControllerName is the reporting controller of the agent's Events.
	ControllerName = "service-with-healthchecks-agent"
)

// Options configure an agent.
type Options struct {
	// NodeName is the node this agent serves (required).
	NodeName string
	// Config reaches the API server.
	Config *rest.Config
	// MetricsBindAddress serves /metrics ("0" disables it).
	MetricsBindAddress string
	// HealthProbeBindAddress serves /healthz and /readyz ("0" disables it).
	HealthProbeBindAddress string
	// LeaseNamespace is where the node's Lease lives (default DefaultLeaseNamespace).
	LeaseNamespace string
	// LeaseRenewInterval is how often the agent renews its node Lease (development/LIVENESS.md);
	// 0 turns the renewal off (tests that do not judge the agents' liveness).
	LeaseRenewInterval time.Duration
	// SkipNameValidation lets one process run several agents (tests); controller-runtime
	// refuses two controllers of one name otherwise.
	SkipNameValidation bool
	// ProbeConcurrency bounds how many probes run at once.
	ProbeConcurrency int
	// MaxProbeTargets bounds the targets (pod × probe) this agent probes, shared fairly
	// between namespaces (development/AGENT.md, "Probe budget"); 0 uses
	// DefaultMaxProbeTargets, a negative value sets no bound (tests).
	MaxProbeTargets int
	// MaxEndpointsPerSlice is how many endpoints one EndpointSlice holds before the agent
	// splits a port's endpoints on the node into chunks (development/AGENT.md, "Chunks"); 0 uses
	// sliceplan.DefaultMaxEndpointsPerSlice (100, the built-in controller's default).
	MaxEndpointsPerSlice int
	// CoalesceWindow and CoalesceBurst coalesce probe result changes per resource: a budget of
	// CoalesceBurst reconciles that regains one every CoalesceWindow. A change is reconciled at
	// once while the budget lasts; once it is spent, the changes that follow are reconciled
	// together when the budget has one again (a storm: one reconcile, and at most one write per
	// slice, per window).
	CoalesceWindow time.Duration
	CoalesceBurst  int
	// Runner runs probes; nil uses the real prober with the credential store.
	Runner scheduler.Runner
	// Registry receives the agent's metrics; nil uses controller-runtime's registry, which the
	// metrics endpoint serves.
	Registry prometheus.Registerer
	// Logger of the agent.
	Logger logr.Logger
}

// Agent is a configured, not yet started agent.
type Agent struct {
	Manager   manager.Manager
	Metrics   *metrics.Metrics
	Scheduler *scheduler.Scheduler
	opts      Options
	// publisher is the agent's one EndpointSlice writer: the reconciler's and the upgrade's.
	publisher *publisher.Publisher
}

// New builds an agent, in steps: the options' defaults, the manager with its caches, indexes
// and health checks, the reconciler, its runner, scheduler and publisher, the runnables beside
// the controller (the credential store, the Lease renewal) and the readiness checks.
func New(opts Options) (*Agent, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	mgr, err := newManager(opts)
	if err != nil {
		return nil, err
	}
	m := metrics.New(opts.Registry)
	r := newReconciler(mgr.GetClient(), opts.NodeName, m, opts.Logger.WithName("reconciler"), opts.CoalesceWindow, opts.CoalesceBurst)
	r.MaxEndpointsPerSlice = opts.MaxEndpointsPerSlice
	if r.podIndex, err = podIndexer(mgr); err != nil {
		return nil, err
	}
	runner, store, err := newRunner(opts, r, m)
	if err != nil {
		return nil, err
	}
	sched := scheduler.New(scheduler.Options{
		Workers:    opts.ProbeConcurrency,
		MaxTargets: max(opts.MaxProbeTargets, 0),
		OnBudget:   r.budgetChanged,
		Runner:     runner,
		OnChange:   r.resultChanged,
		OnLate:     r.probesLate,
		Metrics:    m,
		Logger:     opts.Logger.WithName("scheduler"),
	})
	r.Scheduler = sched
	r.Publisher = &publisher.Publisher{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Metrics: m}
	// Every note is capped to what the events API accepts (lib/eventnote).
	r.Recorder = eventnote.Capped(mgr.GetEventRecorder(ControllerName))
	if err := addRunnables(mgr, opts, m, sched, store); err != nil {
		return nil, err
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := addReadyzChecks(mgr, opts.NodeName); err != nil {
		return nil, err
	}
	return &Agent{Manager: mgr, Metrics: m, Scheduler: sched, opts: opts, publisher: r.Publisher}, nil
}

// withDefaults checks the required options and fills in the defaults of the others.
func (opts Options) withDefaults() (Options, error) {
	if opts.NodeName == "" {
		return opts, errors.New("the node name is required (--node-name or $NODE_NAME)")
	}
	if opts.Config == nil {
		return opts, errors.New("no API server config")
	}
	if opts.MetricsBindAddress == "" {
		opts.MetricsBindAddress = DefaultMetricsBindAddress
	}
	if opts.HealthProbeBindAddress == "" {
		opts.HealthProbeBindAddress = DefaultHealthProbeBindAddress
	}
	if opts.LeaseNamespace == "" {
		opts.LeaseNamespace = DefaultLeaseNamespace
	}
	if opts.ProbeConcurrency <= 0 {
		opts.ProbeConcurrency = DefaultProbeConcurrency
	}
	if opts.MaxProbeTargets == 0 {
		opts.MaxProbeTargets = DefaultMaxProbeTargets
	}
	if opts.MaxEndpointsPerSlice <= 0 {
		opts.MaxEndpointsPerSlice = sliceplan.DefaultMaxEndpointsPerSlice
	}
	if opts.MaxEndpointsPerSlice > sliceplan.MaxOfMaxEndpointsPerSlice {
		return opts, fmt.Errorf("at most %d endpoints fit one EndpointSlice, not %d", sliceplan.MaxOfMaxEndpointsPerSlice, opts.MaxEndpointsPerSlice)
	}
	if opts.CoalesceWindow <= 0 {
		opts.CoalesceWindow = DefaultCoalesceWindow
	}
	if opts.CoalesceBurst <= 0 {
		opts.CoalesceBurst = DefaultCoalesceBurst
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	if opts.Registry == nil {
		opts.Registry = ctrlmetrics.Registry
	}
	return opts, nil
}

// newManager creates the manager with caches narrowed to this node, the slice indexes and the
// liveness check.
func newManager(opts Options) (manager.Manager, error) {
	mgr, err := ctrl.NewManager(opts.Config, ctrl.Options{
		Scheme: Scheme(),
		Logger: opts.Logger,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			// Only this node's pods: the per-node program narrows its cache, it does not
			// filter after listing the whole cluster.
			&corev1.Pod{}: {Field: fields.OneTermEqualSelector("spec.nodeName", opts.NodeName)},
			// Only this module's slices of this node: the agent's memory and watch traffic do
			// not grow with other nodes. A name another node's slice holds is found taken
			// when the agent creates it (the publisher reads it and refuses it).
			&discoveryv1.EndpointSlice{}: {Label: labels.SelectorFromSet(labels.Set{
				discoveryv1.LabelManagedBy: wellknown.ManagedBy,
				wellknown.LabelNodeKey:     slicemeta.NodeKey(opts.NodeName),
			})},
			// Only this agent's own Node, watched by name as MetalLB's speaker does: its zone
			// labels the endpoints from the first write and follows a relabelled node.
			&corev1.Node{}: {Field: fields.OneTermEqualSelector("metadata.name", opts.NodeName)},
		}},
		Metrics:                metricsserver.Options{BindAddress: opts.MetricsBindAddress},
		HealthProbeBindAddress: opts.HealthProbeBindAddress,
		Controller:             config.Controller{SkipNameValidation: ptr.To(opts.SkipNameValidation)},
	})
	if err != nil {
		return nil, fmt.Errorf("creating the manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, fmt.Errorf("adding the health check: %w", err)
	}
	for name, fn := range sliceIndexes {
		if err := mgr.GetFieldIndexer().IndexField(context.Background(), &discoveryv1.EndpointSlice{}, name, fn); err != nil {
			return nil, fmt.Errorf("indexing EndpointSlices (%s): %w", name, err)
		}
	}
	return mgr, nil
}

// podIndexer is the pod informer's indexer: observe reads the cache's pods from it without
// copying them.
func podIndexer(mgr manager.Manager) (toolscache.Indexer, error) {
	podInformer, err := mgr.GetCache().GetInformer(context.Background(), &corev1.Pod{})
	if err != nil {
		return nil, fmt.Errorf("creating the pod informer: %w", err)
	}
	indexed, ok := podInformer.(toolscache.SharedIndexInformer)
	if !ok {
		return nil, fmt.Errorf("the pod informer (%T) has no indexer", podInformer)
	}
	return indexed.GetIndexer(), nil
}

// newRunner is opts.Runner, or the real prober with a credential store (returned too) whose
// changes re-evaluate r's resources.
func newRunner(opts Options, r *Reconciler, m *metrics.Metrics) (scheduler.Runner, *credentials.Store, error) {
	if opts.Runner != nil {
		return opts.Runner, nil, nil
	}
	cs, err := kubernetes.NewForConfig(opts.Config)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the clientset: %w", err)
	}
	store := credentials.NewStore(cs, credentials.Options{Logger: opts.Logger.WithName("credentials"), OnChange: r.secretChanged})
	p := prober.New(prober.Options{Credentials: store, Logger: opts.Logger.WithName("prober")})
	r.Credentials = store
	m.CredentialProblems.SetSource(store.Problems)
	return ProberRunner(p), store, nil
}

// addRunnables adds what runs beside the controller: the scheduler, the credential store's
// stop (when there is a store) and the node Lease renewal (when opts ask for it).
func addRunnables(mgr manager.Manager, opts Options, m *metrics.Metrics, sched *scheduler.Scheduler, store *credentials.Store) error {
	if err := mgr.Add(sched); err != nil {
		return fmt.Errorf("adding the scheduler: %w", err)
	}
	if store != nil {
		if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
			<-ctx.Done()
			store.Stop()
			return nil
		})); err != nil {
			return fmt.Errorf("adding the credential store: %w", err)
		}
	}
	if opts.LeaseRenewInterval <= 0 {
		return nil
	}
	// The node Lease is written with a client of its own, not through the manager's cache.
	lc, err := client.New(opts.Config, client.Options{})
	if err != nil {
		return fmt.Errorf("creating the Lease client: %w", err)
	}
	renewer := &lease.Renewer{Client: lc, Namespace: opts.LeaseNamespace, Node: opts.NodeName,
		Interval: opts.LeaseRenewInterval, Metrics: m, Log: opts.Logger.WithName("lease"),
		Note: func() string { return BudgetNote(sched) }}
	if err := mgr.Add(renewer); err != nil {
		return fmt.Errorf("adding the Lease renewal: %w", err)
	}
	return nil
}

// addReadyzChecks makes the agent ready once its caches are synced and its own Node has been
// read: nothing is published (Reconcile) before that either.
func addReadyzChecks(mgr manager.Manager, node string) error {
	if err := mgr.AddReadyzCheck("cache-synced", func(req *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(req.Context()) {
			return errors.New("caches not synced")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("adding the readiness check: %w", err)
	}
	if err := mgr.AddReadyzCheck("node", func(req *http.Request) error {
		if err := mgr.GetCache().Get(req.Context(), client.ObjectKey{Name: node}, &corev1.Node{}); err != nil {
			return fmt.Errorf("node %s not read yet: %w", node, err)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("adding the readiness check: %w", err)
	}
	return nil
}

// Run runs the agent until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	// Before the caches start: slices published by an agent that did not label them with
	// their node key are labelled, so the node-filtered cache holds them and the first
	// reconcile carries their verdicts over (an upgrade does not flap).
	if err := labelOwnSlices(ctx, a.publisher, a.opts.NodeName, a.opts.Logger.WithName("upgrade")); err != nil {
		return err
	}
	if err := a.Manager.Start(ctx); err != nil {
		return fmt.Errorf("running the agent: %w", err)
	}
	return nil
}

// ProberRunner adapts the prober to the scheduler.
func ProberRunner(p *prober.Prober) scheduler.Runner {
	return scheduler.RunnerFunc(func(ctx context.Context, t scheduler.Target) scheduler.Outcome {
		res, err := p.Probe(ctx, t.Probe, t.Namespace, t.PodIP, t.Port)
		if err != nil {
			return scheduler.Outcome{Err: err}
		}
		return scheduler.Outcome{Pass: res.Outcome == prober.Success, Deferred: res.Outcome == prober.Deferred, Reason: res.Reason}
	})
}
