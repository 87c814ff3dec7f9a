// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package metrics reads a program's Prometheus metrics for tests and benchmarks: one scrape of
// a /metrics endpoint parsed by the Prometheus text parser (github.com/prometheus/common/expfmt),
// and the samples of a metric by name and labels.
//
//	fams, err := metrics.Get(ctx, s.ControllerMetricsAddr(0))
//	lead, err := fams.Value(`leader_election_master_status{name="service-with-healthchecks-controller"}`)
//	writes := fams.Sum("swh_agent_endpointslice_writes_total", nil)
package metrics

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrapeTimeout bounds a scrape whose context has no deadline.
const scrapeTimeout = 10 * time.Second

// Families are the metric families of one scrape, by name.
type Families map[string]*dto.MetricFamily

// Sample is one sample as the text format exposes it: a series' labels and its value.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Parse reads the Prometheus text format.
func Parse(r io.Reader) (Families, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	return fams, nil
}

// Get scrapes http://<addr>/metrics (a program's metrics address, "127.0.0.1:port").
func Get(ctx context.Context, addr string) (Families, error) {
	return Scrape(ctx, nil, "http://"+addr+"/metrics")
}

// Scrape reads url with hc (nil: a plain client; the API server's /metrics needs one from
// rest.HTTPClientFor) and parses the answer. A context without a deadline gets 10 s.
func Scrape(ctx context.Context, hc *http.Client, url string) (Families, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, scrapeTimeout)
		defer cancel()
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: %s", url, resp.Status)
	}
	fams, err := Parse(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	return fams, nil
}

// Samples returns every sample of the metric name as the text format writes it: the series of
// a counter, gauge or untyped metric, and for a histogram or summary "x" the samples of
// "x_sum", "x_count", "x_bucket" (label le) and "x" (label quantile).
func (f Families) Samples(name string) []Sample {
	if fam, ok := f[name]; ok {
		return samples(fam, "")
	}
	for _, suffix := range []string{"_sum", "_count", "_bucket"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		if fam, ok := f[base]; ok && (fam.GetType() == dto.MetricType_HISTOGRAM || fam.GetType() == dto.MetricType_GAUGE_HISTOGRAM || fam.GetType() == dto.MetricType_SUMMARY) {
			return samples(fam, suffix)
		}
	}
	return nil
}

// Sum adds the values of the metric's samples whose labels include labels (nil: all of them);
// 0 when there are none.
func (f Families) Sum(name string, labels map[string]string) float64 {
	sum := 0.0
	for _, s := range f.Samples(name) {
		if includes(s.Labels, labels) {
			sum += s.Value
		}
	}
	return sum
}

// Value returns the value of the one series named as the text format writes it: `name` or
// `name{label="value",...}`, whose labels must be among the series' own. It is an error when
// no series or several match.
func (f Families) Value(series string) (float64, error) {
	name, labels, err := ParseSeries(series)
	if err != nil {
		return 0, err
	}
	var found []Sample
	for _, s := range f.Samples(name) {
		if includes(s.Labels, labels) {
			found = append(found, s)
		}
	}
	switch len(found) {
	case 0:
		return 0, fmt.Errorf("metric %s not found", series)
	case 1:
		return found[0].Value, nil
	default:
		return 0, fmt.Errorf("metric %s: %d series match", series, len(found))
	}
}

// ParseSeries splits a series as the text format writes it, `name{label="value",...}`, into
// its name and labels (parsed by the text parser itself, as a sample line).
func ParseSeries(series string) (name string, labels map[string]string, err error) {
	fams, err := Parse(strings.NewReader(series + " 0\n"))
	if err != nil || len(fams) != 1 {
		return "", nil, fmt.Errorf("%q is not a series such as name{label=\"value\"}: %w", series, err)
	}
	for n, fam := range fams {
		name = n
		labels = labelMap(fam.GetMetric()[0].GetLabel())
	}
	return name, labels, nil
}

// samples flattens a family into text-format samples; suffix picks the part of a histogram or
// summary ("" for the quantiles of a summary).
func samples(fam *dto.MetricFamily, suffix string) []Sample {
	var out []Sample
	for _, m := range fam.GetMetric() {
		labels := labelMap(m.GetLabel())
		add := func(v float64, k, kv string) {
			l := labels
			if k != "" {
				l = maps.Clone(labels)
				l[k] = kv
			}
			out = append(out, Sample{l, v})
		}
		h, s := m.GetHistogram(), m.GetSummary()
		switch {
		case fam.GetType() == dto.MetricType_COUNTER:
			add(m.GetCounter().GetValue(), "", "")
		case fam.GetType() == dto.MetricType_GAUGE:
			add(m.GetGauge().GetValue(), "", "")
		case fam.GetType() == dto.MetricType_UNTYPED:
			add(m.GetUntyped().GetValue(), "", "")
		case suffix == "_sum":
			add(h.GetSampleSum()+s.GetSampleSum(), "", "") // one of them is nil and reads 0
		case suffix == "_count":
			add(float64(h.GetSampleCount()+s.GetSampleCount()), "", "")
		case suffix == "_bucket" && h != nil:
			inf := false
			for _, b := range h.GetBucket() {
				inf = inf || math.IsInf(b.GetUpperBound(), 1)
				add(float64(b.GetCumulativeCount()), "le", formatFloat(b.GetUpperBound()))
			}
			if !inf { // the text parser keeps a +Inf bucket it read: the count is that bucket
				add(float64(h.GetSampleCount()), "le", "+Inf")
			}
		case suffix == "":
			for _, q := range s.GetQuantile() {
				add(q.GetValue(), "quantile", formatFloat(q.GetQuantile()))
			}
		}
	}
	return out
}

func labelMap(pairs []*dto.LabelPair) map[string]string {
	out := make(map[string]string, len(pairs))
	for _, l := range pairs {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// includes reports whether have holds every label of want.
func includes(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func formatFloat(v float64) string {
	if math.IsInf(v, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
