// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package metricsdesc lists the metrics a program registers without serving them: the hidden
// describe-metrics command of the agent and of the controller prints them, and tests/monitoring
// and the docs/METRICS.md check read that list.
package metricsdesc

import (
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Recorder is a prometheus.Registerer that only remembers the collectors registered with it, so
// that a program can list its metrics without serving them (the describe-metrics command, which
// the monitoring tests and docs/METRICS.md checks run).
type Recorder struct {
	mu         sync.Mutex
	collectors []prometheus.Collector
}

var _ prometheus.Registerer = (*Recorder)(nil)

// Register remembers c.
func (r *Recorder) Register(c prometheus.Collector) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.collectors = append(r.collectors, c)
	return nil
}

// MustRegister remembers cs.
func (r *Recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}

// Unregister forgets c.
func (r *Recorder) Unregister(c prometheus.Collector) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, have := range r.collectors {
		if have == c {
			r.collectors = append(r.collectors[:i], r.collectors[i+1:]...)
			return true
		}
	}
	return false
}

// Description is one metric as its collector describes it.
type Description struct {
	// Name is the metric's full name.
	Name string
	// Type is counter, gauge, histogram or summary.
	Type string
	// Labels are the variable labels, in order.
	Labels []string
	// Help is the help text.
	Help string
}

// Typed is implemented by custom collectors to tell the type of the metrics they describe.
type Typed interface {
	// MetricType is counter, gauge, histogram or summary.
	MetricType() string
}

var descPattern = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*"), unit: "(?:[^"\\]|\\.)*", constLabels: \{[^}]*\}, variableLabels: \{([^}]*)\}\}$`)

// Descriptions lists the metrics of the recorded collectors from their Describe (not Gather,
// which omits vectors without children), sorted by name.
func (r *Recorder) Descriptions() ([]Description, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Description
	for _, c := range r.collectors {
		typ := collectorType(c)
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := descPattern.FindStringSubmatch(d.String())
			if m == nil {
				return nil, fmt.Errorf("cannot read the description %s", d)
			}
			name, err := strconv.Unquote(m[1])
			if err != nil {
				return nil, fmt.Errorf("metric name of %s: %w", d, err)
			}
			help, err := strconv.Unquote(m[2])
			if err != nil {
				return nil, fmt.Errorf("help of %s: %w", d, err)
			}
			var labels []string
			if m[3] != "" {
				labels = strings.Split(m[3], ",")
			}
			out = append(out, Description{Name: name, Type: typ, Labels: labels, Help: help})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Write prints the descriptions, one tab-separated line each: name, type, labels (comma
// separated, "-" for none), help.
func (r *Recorder) Write(w io.Writer) error {
	ds, err := r.Descriptions()
	if err != nil {
		return err
	}
	for _, d := range ds {
		labels := strings.Join(d.Labels, ",")
		if labels == "" {
			labels = "-"
		}
		if _, err := fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", d.Name, d.Type, labels, d.Help); err != nil {
			return fmt.Errorf("writing the metric descriptions: %w", err)
		}
	}
	return nil
}

// collectorType tells the type of a collector's metrics; "untyped" when unknown.
func collectorType(c prometheus.Collector) string {
	switch c := c.(type) {
	case Typed:
		return c.MetricType()
	case *prometheus.CounterVec:
		return "counter"
	case *prometheus.GaugeVec:
		return "gauge"
	case *prometheus.HistogramVec:
		return "histogram"
	case *prometheus.SummaryVec:
		return "summary"
	case prometheus.Gauge: // before Counter: a Gauge has Inc and Add too
		return "gauge"
	case prometheus.Counter:
		return "counter"
	case prometheus.Histogram: // a Summary has Observe too; the programs have none
		return "histogram"
	default:
		return "untyped"
	}
}
