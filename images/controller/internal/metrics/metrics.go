// Package metrics defines every metric of the controller (one file, documented in
// docs/CONTROLLER.md). Labels are bounded: no resource, pod or node names.
package metrics

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
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
	OpUpdateStatus  = "update_status"
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
	// StatusWrites counts status updates; flat in a steady state.
	StatusWrites prometheus.Counter
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
		StatusWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "status_writes_total",
			Help: "Status updates of ServiceWithHealthchecks; flat while nothing changes.",
		}),
	}
	var errs []error
	for _, c := range []prometheus.Collector{
		m.Reconciles, m.ReconcileDuration, m.Errors, m.Conflicts, m.Adoptions,
		m.GarbageCollectedSlices, m.ServiceWrites, m.StatusWrites,
	} {
		errs = append(errs, reg.Register(c))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("registering controller metrics: %w", err)
	}
	return m, nil
}
