// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package metrics holds every metric the agent exports (documented in docs/METRICS.md). No metric
// carries a per-pod or per-resource label, so the number of series does not grow with the
// cluster and nothing is left behind when targets go.
package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deckhouse/service-with-healthchecks/lib/version"
)

// Label values of the outcome label.
const (
	OutcomeSuccess = "success"
	OutcomeFailure = "failure"
	// OutcomeError is a probe that could not be run at all (invalid input); it counts as a
	// failure for the thresholds.
	OutcomeError = "error"
	// OutcomeDeferred is a probe that was not run because an input is still loading (its
	// credential Secret); it counts for nothing.
	OutcomeDeferred = "deferred"
)

// Label values of the operation label.
const (
	OpCreate = "create"
	OpUpdate = "update"
	OpDelete = "delete"
)

// Label values of the state label of Endpoints.
const (
	StateReady       = "ready"
	StateNotReady    = "not_ready"
	StateTerminating = "terminating"
)

// Metrics are the agent's metrics.
type Metrics struct {
	// ProbeDuration is how long one probe run took, by mode and outcome.
	ProbeDuration *prometheus.HistogramVec
	// ProbeResults counts probe runs by mode and outcome.
	ProbeResults *prometheus.CounterVec
	// ProbeTransitions counts thresholded result changes by mode and new state.
	ProbeTransitions *prometheus.CounterVec
	// SchedulingLag is how late a probe started after it was due.
	SchedulingLag prometheus.Histogram
	// LateRuns counts probe runs that started more than one period after they were due.
	LateRuns prometheus.Counter
	// Targets is the number of (pod, probe) targets the agent probes (those in budget).
	Targets prometheus.Gauge
	// TargetsOverBudget is the number of targets asked for beyond the probe budget: not probed.
	TargetsOverBudget prometheus.Gauge
	// ProbeBudget is the probe budget, --max-probe-targets (0: no bound).
	ProbeBudget prometheus.Gauge
	// Endpoints is the number of (pod address, port) endpoints the agent publishes, by state.
	Endpoints *prometheus.GaugeVec
	// SliceWrites counts successful EndpointSlice writes by operation.
	SliceWrites *prometheus.CounterVec
	// SliceWriteErrors counts failed EndpointSlice writes by operation.
	SliceWriteErrors *prometheus.CounterVec
	// SliceConflicts counts refusals to write a slice whose name another object holds.
	SliceConflicts prometheus.Counter
	// PortTransitions counts the probed ports of pods that turned serving or not serving in a
	// slice this agent wrote, by new state (serving, not_serving): every one, also those an
	// Event reports only in a summary.
	PortTransitions *prometheus.CounterVec
	// TransitionEvents counts the Events that report port transitions, by kind (one: one
	// transition; summary: the transitions of a resource in one window).
	TransitionEvents *prometheus.CounterVec
	// CredentialProblems counts, at scrape time, the referenced credential Secrets that cannot
	// be used, by problem (missing, wrong_type, malformed, unreadable).
	CredentialProblems *CredentialProblems
	// LeaseLastRenew is the Unix time of the last successful renewal of the node Lease.
	LeaseLastRenew prometheus.Gauge
	// LeaseRenewErrors counts failed renewals of the node Lease.
	LeaseRenewErrors prometheus.Counter
}

// The kinds of credential Secret problems: the values of the problem label of
// swh_agent_credential_secret_problems, and the kinds the credentials store classifies Secrets
// into (credentials.Store.Problems).
const (
	// ProblemMissing: the Secret does not exist (the watch is synced and found nothing).
	ProblemMissing = "missing"
	// ProblemWrongType: the Secret exists with another type than the credential type.
	ProblemWrongType = "wrong_type"
	// ProblemMalformed: the Secret has the credential type but its keys are wrong.
	ProblemMalformed = "malformed"
	// ProblemUnreadable: the Secret cannot be read (e.g. Forbidden: the agent's Role does not
	// name it yet) and was never loaded.
	ProblemUnreadable = "unreadable"
)

// CredentialProblemKinds are all problem kinds, in a fixed order.
var CredentialProblemKinds = []string{ProblemMissing, ProblemWrongType, ProblemMalformed, ProblemUnreadable}

// CredentialProblems is the gauge swh_agent_credential_secret_problems{problem}, computed at
// scrape time from a source (the credentials store): a Secret that turns missing without an
// event (a watch that synced empty) is counted without anyone having to push it.
type CredentialProblems struct {
	desc *prometheus.Desc

	mu     sync.Mutex
	source func() map[string]int
}

// SetSource sets where the counts come from; without a source every kind is zero.
func (c *CredentialProblems) SetSource(f func() map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.source = f
}

// Describe implements prometheus.Collector.
func (c *CredentialProblems) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector: one series per problem kind, zero included.
func (c *CredentialProblems) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	f := c.source
	c.mu.Unlock()
	var counts map[string]int
	if f != nil {
		counts = f()
	}
	for _, k := range CredentialProblemKinds {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[k]), k)
	}
}

// New creates the metrics and registers them with reg (nil registers nothing, for tests).
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		ProbeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "swh_agent_probe_duration_seconds",
			Help:    "Duration of one probe run, by mode and outcome.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"mode", "outcome"}),
		ProbeResults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "swh_agent_probe_results_total",
			Help: "Probe runs, by mode and outcome (success, failure, error).",
		}, []string{"mode", "outcome"}),
		ProbeTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "swh_agent_probe_transitions_total",
			Help: "Changes of a target's thresholded result, by mode and new state (Pass, Fail).",
		}, []string{"mode", "state"}),
		SchedulingLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "swh_agent_probe_scheduling_lag_seconds",
			Help:    "How late a probe run started after it was due (waiting for a free worker).",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 2.5, 5, 10},
		}),
		LateRuns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "swh_agent_probe_late_runs_total",
			Help: "Probe runs that started more than one period after they were due: every worker was busy, or the namespace had its share of them in flight.",
		}),
		Targets: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "swh_agent_probe_targets",
			Help: "Number of (pod, probe) targets this agent probes.",
		}),
		TargetsOverBudget: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "swh_agent_probe_targets_over_budget",
			Help: "Number of (pod, probe) targets beyond this agent's probe budget: not probed, their ports published not serving (the resources get the ProbeBudgetExceeded condition).",
		}),
		ProbeBudget: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "swh_agent_probe_budget_targets",
			Help: "The most (pod, probe) targets this agent probes, shared fairly between namespaces (--max-probe-targets; 0 is no bound).",
		}),
		Endpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "swh_agent_endpoints",
			Help: "Endpoints (pod address on a Service port) this agent publishes, by state (ready, not_ready, terminating).",
		}, []string{"state"}),
		SliceWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "swh_agent_endpointslice_writes_total",
			Help: "EndpointSlice writes by operation (create, update, delete).",
		}, []string{"operation"}),
		SliceWriteErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "swh_agent_endpointslice_write_errors_total",
			Help: "Failed EndpointSlice writes by operation (create, update, delete).",
		}, []string{"operation"}),
		SliceConflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "swh_agent_endpointslice_name_conflicts_total",
			Help: "Refusals to write an EndpointSlice whose name is held by an object this agent does not own.",
		}),
		PortTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "swh_agent_port_transitions_total",
			Help: "Probed ports of pods that turned serving or not serving in a slice this agent wrote, by new state (serving, not_serving).",
		}, []string{"state"}),
		TransitionEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "swh_agent_transition_events_total",
			Help: "Events reporting port transitions, by kind: one (a single transition) or summary (a resource's transitions in one window).",
		}, []string{"kind"}),
		CredentialProblems: &CredentialProblems{desc: prometheus.NewDesc("swh_agent_credential_secret_problems",
			"Credential Secrets referenced by PostgreSQL and MySQL probes on this node that cannot be used, by problem (missing, wrong_type, malformed, unreadable); their probes cannot run.",
			[]string{"problem"}, nil)},
		LeaseLastRenew: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "swh_agent_lease_last_renew_timestamp_seconds",
			Help: "Unix time of the last successful renewal of this agent's node Lease (the controller judges liveness by it).",
		}),
		LeaseRenewErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "swh_agent_lease_renew_errors_total",
			Help: "Failed renewals of this agent's node Lease.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.ProbeDuration, m.ProbeResults, m.ProbeTransitions, m.SchedulingLag, m.LateRuns,
			m.Targets, m.TargetsOverBudget, m.ProbeBudget, m.Endpoints, m.SliceWrites, m.SliceWriteErrors, m.SliceConflicts, m.PortTransitions, m.TransitionEvents, m.CredentialProblems,
			m.LeaseLastRenew, m.LeaseRenewErrors)
	}
	// The build: swh_agent_build_info (development/RELEASING.md).
	if reg != nil {
		reg.MustRegister(version.BuildInfo("swh_agent_build_info"))
	}
	return m
}

// MetricType tells the describe-metrics command that the metric is a gauge.
func (c *CredentialProblems) MetricType() string { return "gauge" }
