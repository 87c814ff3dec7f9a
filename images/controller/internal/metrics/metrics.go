// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package metrics defines the metrics of the controller (documented in docs/METRICS.md). Labels
// are bounded: no pod names; the per-port endpoint gauges carry the resource's namespace, name and
// port (one series per Service port of a resource), the stale-agent gauge the node (one series
// per stale node).
package metrics

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/lib/version"
)

const namespace = "swh_controller"

// Values of the result label of Reconciles.
const (
	ResultSuccess = "success"
	ResultError   = "error"
	ResultRequeue = "requeue"
)

// Values of the operation label of Errors and ServiceWrites.
const (
	OpRead          = "read"
	OpCreate        = "create_service"
	OpApply         = "apply_service"
	OpUpgradeFields = "upgrade_managed_fields"
	OpClearSelector = "clear_selector"
	OpDeleteService = "delete_service"
	OpDeleteSlice   = "delete_slice"
	// OpDeleteBuiltinSlice deletes a built-in EndpointSlice of an adopted Service.
	OpDeleteBuiltinSlice = "delete_builtin_slice"
	OpUpdateStatus       = "update_status"
)

// Values of the kind label of Conflicts.
const (
	// ConflictWrite: the API server refused a write because the object changed meanwhile (409).
	ConflictWrite = "write"
	// ConflictForeignService: a Service of the resource's name belongs to someone else.
	ConflictForeignService = "foreign_service"
)

// Metrics are the controller's own metrics.
type Metrics struct {
	// Reconciles counts reconciles of a resource by result.
	Reconciles *prometheus.CounterVec
	// ReconcileDuration observes how long a reconcile takes.
	ReconcileDuration prometheus.Histogram
	// Errors counts failed API operations by operation.
	Errors *prometheus.CounterVec
	// Conflicts counts write conflicts and reconciles that found a foreign Service.
	Conflicts *prometheus.CounterVec
	// Adoptions counts Services adopted.
	Adoptions prometheus.Counter
	// GarbageCollectedSlices counts EndpointSlices deleted as garbage, by reason.
	GarbageCollectedSlices *prometheus.CounterVec
	// ServiceWrites counts writes to child Services by operation; flat in a steady state.
	ServiceWrites *prometheus.CounterVec
	// BuiltinSlicesDeleted counts the built-in EndpointSlices of adopted Services that the
	// controller deleted after clearing their selector.
	BuiltinSlicesDeleted prometheus.Counter
	// StatusWrites counts status updates; flat in a steady state.
	StatusWrites prometheus.Counter
	// PortReadyEndpoints is, per resource port, the ready endpoints of the last computed status.
	PortReadyEndpoints *prometheus.GaugeVec
	// PortEndpoints is, per resource port, all endpoints of the last computed status.
	PortEndpoints *prometheus.GaugeVec
	// Liveness are the metrics of the agents' liveness and of the withdrawals.
	Liveness *Liveness
	// AuditedSlices counts audits of this module's EndpointSlices (package audit).
	AuditedSlices prometheus.Counter
	// ForgedSlices counts EndpointSlices deleted because an endpoint failed the audit.
	ForgedSlices prometheus.Counter
	// NodeForgeries is, per node, how many confirmed forgeries the audit remembers (a slice of
	// the node that repeats one is deleted at once); the series is deleted once they expire.
	NodeForgeries *prometheus.GaugeVec
	// RedundantSlices counts EndpointSlices deleted because they repeat endpoints that another
	// slice of their resource, port, node and family lists (no agent plan does).
	RedundantSlices prometheus.Counter

	mu    sync.Mutex
	ports map[types.NamespacedName][]string // port label values set per resource
}

// New creates the metrics and registers them with reg (controller-runtime's metrics.Registry in
// the program, a fresh registry in tests).
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "reconciles_total",
			Help: "Reconciles of a ServiceWithHealthchecks, by result (success, error, requeue).",
		}, []string{"result"}),
		ReconcileDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "reconcile_duration_seconds",
			Help:    "Duration of one reconcile of a ServiceWithHealthchecks.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "errors_total",
			Help: "Failed API operations, by operation.",
		}, []string{"operation"}),
		Conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "conflicts_total",
			Help: "Write conflicts (kind=write, retried) and reconciles that found a Service of the resource's name owned by someone else (kind=foreign_service).",
		}, []string{"kind"}),
		Adoptions: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "adoptions_total",
			Help: "Existing Services adopted through the network.deckhouse.io/adopt annotation.",
		}),
		GarbageCollectedSlices: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "garbage_collected_slices_total",
			Help: "EndpointSlices of this module deleted because nothing they belong to exists any more, by reason.",
		}, []string{"reason"}),
		ServiceWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "service_writes_total",
			Help: "Writes to child Services, by operation; flat while nothing changes.",
		}, []string{"operation"}),
		BuiltinSlicesDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "builtin_slices_deleted_total",
			Help: "EndpointSlices of the built-in EndpointSlice controller deleted from adopted Services once their selector was cleared (the built-in controller leaves them).",
		}),
		StatusWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "status_writes_total",
			Help: "Status updates of ServiceWithHealthchecks; flat while nothing changes.",
		}),
		PortReadyEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "port_ready_endpoints",
			Help: "Ready endpoints of a Service port of a ServiceWithHealthchecks (status.ports readyEndpoints), by namespace, name and port (the port's name, or its number when unnamed).",
		}, PortLabels),
		PortEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "port_endpoints",
			Help: "All endpoints (ready or not) of a Service port of a ServiceWithHealthchecks (status.ports totalEndpoints), by namespace, name and port.",
		}, PortLabels),
		ports: map[types.NamespacedName][]string{},
	}
	m.newAuditMetrics()
	var errs []error
	for _, c := range []prometheus.Collector{
		m.Reconciles, m.ReconcileDuration, m.Errors, m.Conflicts, m.Adoptions,
		m.GarbageCollectedSlices, m.ServiceWrites, m.BuiltinSlicesDeleted, m.StatusWrites, m.PortReadyEndpoints, m.PortEndpoints,
		m.AuditedSlices, m.ForgedSlices, m.NodeForgeries, m.RedundantSlices,
	} {
		errs = append(errs, reg.Register(c))
	}
	// The build: swh_controller_build_info (development/RELEASING.md).
	errs = append(errs, reg.Register(version.BuildInfo(namespace+"_build_info")))
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("registering controller metrics: %w", err)
	}
	lm, err := NewLiveness(reg)
	if err != nil {
		return nil, err
	}
	m.Liveness = lm
	return m, nil
}

// newAuditMetrics creates the metrics of the EndpointSlice audit (registered by New).
func (m *Metrics) newAuditMetrics() {
	m.AuditedSlices = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "audited_endpointslices_total",
		Help: "Audits of this module's EndpointSlices against the Pods their endpoints name.",
	})
	m.ForgedSlices = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "forged_endpointslices_total",
		Help: "EndpointSlices of this module deleted because an endpoint does not match the Pod it names (no such Pod, another UID, IP or node, or a Pod the resource does not select).",
	})
	m.NodeForgeries = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "node_forged_endpoints",
		Help: "Forged endpoints the audit has confirmed for a node and remembers (a slice of the node that repeats one is deleted at once), by node; the series goes once they expire.",
	}, []string{"node"})
	m.RedundantSlices = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "redundant_endpointslices_total",
		Help: "EndpointSlices of this module deleted because they repeat endpoints that another slice of the same resource, port, node and family lists (an agent lists each endpoint in one slice).",
	})
}

// SetNodeForgeries sets the confirmed forgeries remembered for node (0 deletes its series).
func (m *Metrics) SetNodeForgeries(node string, n int) {
	if n == 0 {
		m.NodeForgeries.DeleteLabelValues(node)
		return
	}
	m.NodeForgeries.WithLabelValues(node).Set(float64(n))
}

// PortLabels are the labels of the per-port endpoint gauges.
var PortLabels = []string{"namespace", "name", "port"}

// SetPorts sets the per-port endpoint gauges of one resource from its computed status ports and
// deletes the series of its ports that are gone.
func (m *Metrics) SetPorts(resource types.NamespacedName, ports []v1alpha1.PortStatus) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := make([]string, 0, len(ports))
	for _, p := range ports {
		port := p.DisplayName()
		now = append(now, port)
		m.PortReadyEndpoints.WithLabelValues(resource.Namespace, resource.Name, port).Set(float64(p.ReadyEndpoints))
		m.PortEndpoints.WithLabelValues(resource.Namespace, resource.Name, port).Set(float64(p.TotalEndpoints))
	}
	for _, old := range m.ports[resource] {
		if !slices.Contains(now, old) {
			m.deletePort(resource, old)
		}
	}
	if len(now) == 0 {
		delete(m.ports, resource)
		return
	}
	m.ports[resource] = now
}

// ForgetResource deletes the per-port endpoint gauges of a resource that is gone or being
// deleted.
func (m *Metrics) ForgetResource(resource types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, old := range m.ports[resource] {
		m.deletePort(resource, old)
	}
	delete(m.ports, resource)
}

func (m *Metrics) deletePort(resource types.NamespacedName, port string) {
	m.PortReadyEndpoints.DeleteLabelValues(resource.Namespace, resource.Name, port)
	m.PortEndpoints.DeleteLabelValues(resource.Namespace, resource.Name, port)
}

// Liveness are the metrics of the agents' liveness (development/LIVENESS.md): the judgement
// and the withdrawal of stale nodes' endpoints. New registers them with the others; NewLiveness
// alone serves tests of the liveness package.
type Liveness struct {
	// StaleAgents is how many agents looked stale at the last judgement.
	StaleAgents prometheus.Gauge
	// KnownAgents is how many agents the tracker knew at the last judgement.
	KnownAgents prometheus.Gauge
	// GuardHolding is 1 while more than half of the agents look stale and nothing is withdrawn.
	GuardHolding prometheus.Gauge
	// WithdrawnSlices counts slices whose endpoints were withdrawn.
	WithdrawnSlices prometheus.Counter
	// WithdrawnEndpoints counts endpoints withdrawn.
	WithdrawnEndpoints prometheus.Counter
	// Errors counts failed reads and writes of a withdrawal round.
	Errors prometheus.Counter
	// StaleNodes is 1 per stale node (swh_controller_agent_stale{node}).
	StaleNodes *StaleAgents
}

// NewLiveness creates the liveness metrics and registers them with reg.
func NewLiveness(reg prometheus.Registerer) (*Liveness, error) {
	m := &Liveness{
		StaleAgents: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "agents_stale",
			Help: "Agents whose node Lease renewTime has not changed for longer than the grace, on the controller's clock."}),
		KnownAgents: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "agents_known",
			Help: "Agents whose node Lease the controller has seen."}),
		GuardHolding: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "liveness_guard_holding",
			Help: "1 while more than half of the agents look stale at once: nothing is withdrawn (suspect the API server or the controller). Alert on it."}),
		WithdrawnSlices: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "withdrawn_slices_total",
			Help: "EndpointSlices of stale nodes whose endpoints were set to ready=false, serving=false."}),
		WithdrawnEndpoints: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "withdrawn_endpoints_total",
			Help: "Endpoints of stale nodes set to ready=false, serving=false."}),
		Errors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "withdraw_errors_total",
			Help: "Failed API reads and writes while withdrawing the endpoints of stale nodes."}),
		StaleNodes: NewStaleAgents(),
	}
	for _, c := range []prometheus.Collector{m.StaleAgents, m.KnownAgents, m.GuardHolding, m.WithdrawnSlices, m.WithdrawnEndpoints, m.Errors, m.StaleNodes.Collector()} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering withdrawal metrics: %w", err)
		}
	}
	return m, nil
}

// SetVerdict shows a judgement: the agents known and stale, whether the guard holds, and the
// stale nodes by name.
func (m *Liveness) SetVerdict(known int, stale []string, guarded bool) {
	m.KnownAgents.Set(float64(known))
	m.StaleAgents.Set(float64(len(stale)))
	guard := 0.0
	if guarded {
		guard = 1
	}
	m.GuardHolding.Set(guard)
	m.StaleNodes.Set(stale)
}

// StaleAgents is the per-node gauge swh_controller_agent_stale: 1 for every node whose agent the
// liveness tracker judged stale at its last judgement (series of nodes that are fresh again or
// forgotten are deleted). While the liveness guard holds, stale nodes are still shown but their
// endpoints are not withdrawn.
type StaleAgents struct {
	vec *prometheus.GaugeVec

	mu    sync.Mutex
	nodes map[string]bool
}

// NewStaleAgents creates the gauge; register Collector() with the program's registry.
func NewStaleAgents() *StaleAgents {
	return &StaleAgents{
		vec: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "agent_stale",
			Help: "1 for every node whose agent's Lease renewTime has not changed for longer than the grace (its endpoints are withdrawn unless the liveness guard holds), by node.",
		}, []string{"node"}),
		nodes: map[string]bool{},
	}
}

// Collector is the gauge to register.
func (s *StaleAgents) Collector() prometheus.Collector { return s.vec }

// Set makes the stale nodes exactly these.
func (s *StaleAgents) Set(nodes []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		now[n] = true
		s.vec.WithLabelValues(n).Set(1)
	}
	for n := range s.nodes {
		if !now[n] {
			s.vec.DeleteLabelValues(n)
		}
	}
	s.nodes = now
}
