// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package metricsdesc

import (
	"bytes"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// problems is a custom collector that tells its type, as the agent's credential-problem gauge
// does.
type problems struct{ desc *prometheus.Desc }

func (p problems) Describe(ch chan<- *prometheus.Desc) { ch <- p.desc }
func (p problems) Collect(chan<- prometheus.Metric)    {}
func (p problems) MetricType() string                  { return "gauge" }

// untyped is a custom collector that does not.
type untyped struct{ desc *prometheus.Desc }

func (u untyped) Describe(ch chan<- *prometheus.Desc) { ch <- u.desc }
func (u untyped) Collect(chan<- prometheus.Metric)    {}

func TestDescriptions(t *testing.T) {
	tests := map[string]struct {
		collector prometheus.Collector
		want      Description
	}{
		"a counter vector with labels": {
			collector: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "Counts."}, []string{"mode", "outcome"}),
			want:      Description{Name: "x_total", Type: "counter", Labels: []string{"mode", "outcome"}, Help: "Counts."},
		},
		"a gauge vector": {
			collector: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "x", Help: "Level."}, []string{"node"}),
			want:      Description{Name: "x", Type: "gauge", Labels: []string{"node"}, Help: "Level."},
		},
		"a histogram vector": {
			collector: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "x_seconds", Help: "Time."}, []string{"result"}),
			want:      Description{Name: "x_seconds", Type: "histogram", Labels: []string{"result"}, Help: "Time."},
		},
		"a summary vector": {
			collector: prometheus.NewSummaryVec(prometheus.SummaryOpts{Name: "x_summary", Help: "Spread."}, []string{"a"}),
			want:      Description{Name: "x_summary", Type: "summary", Labels: []string{"a"}, Help: "Spread."},
		},
		"a lone gauge is a gauge, not a counter": {
			collector: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "swh", Name: "g", Help: "Level."}),
			want:      Description{Name: "swh_g", Type: "gauge", Help: "Level."},
		},
		"a lone counter": {
			collector: prometheus.NewCounter(prometheus.CounterOpts{Name: "c_total", Help: "Counts."}),
			want:      Description{Name: "c_total", Type: "counter", Help: "Counts."},
		},
		"a lone histogram": {
			collector: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h_seconds", Help: "Time."}),
			want:      Description{Name: "h_seconds", Type: "histogram", Help: "Time."},
		},
		"const labels are not variable labels": {
			collector: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "x", Help: "Level.", ConstLabels: prometheus.Labels{"k": "v"}}, []string{"node"}),
			want:      Description{Name: "x", Type: "gauge", Labels: []string{"node"}, Help: "Level."},
		},
		"a help with quotes and a newline is read back as written": {
			collector: prometheus.NewGauge(prometheus.GaugeOpts{Name: "x", Help: "Says \"hi\",\nthen stops."}),
			want:      Description{Name: "x", Type: "gauge", Help: "Says \"hi\",\nthen stops."},
		},
		"a custom collector tells its type": {
			collector: problems{prometheus.NewDesc("p", "Problems.", []string{"problem"}, nil)},
			want:      Description{Name: "p", Type: "gauge", Labels: []string{"problem"}, Help: "Problems."},
		},
		"a custom collector that does not is untyped": {
			collector: untyped{prometheus.NewDesc("u", "Unknown.", nil, nil)},
			want:      Description{Name: "u", Type: "untyped", Help: "Unknown."},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := &Recorder{}
			require.NoError(t, r.Register(tc.collector))
			got, err := r.Descriptions()
			require.NoError(t, err)
			assert.Equal(t, []Description{tc.want}, got)
		})
	}
}

func TestWriteListsEveryMetricSortedByName(t *testing.T) {
	r := &Recorder{}
	gone := prometheus.NewGauge(prometheus.GaugeOpts{Name: "gone", Help: "Unregistered."})
	r.MustRegister(
		prometheus.NewCounterVec(prometheus.CounterOpts{Name: "b_total", Help: "B."}, []string{"x", "y"}),
		gone,
		prometheus.NewGauge(prometheus.GaugeOpts{Name: "a", Help: "A."}),
	)
	assert.True(t, r.Unregister(gone))
	assert.False(t, r.Unregister(gone), "a collector is forgotten once")
	var out bytes.Buffer
	require.NoError(t, r.Write(&out))
	assert.Equal(t, "a\tgauge\t-\tA.\nb_total\tcounter\tx,y\tB.\n", out.String())
}
