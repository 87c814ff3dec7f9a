// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package metrics_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/testkit/metrics"
)

// exposition is what a controller-runtime program serves, cut down: a labelled gauge, an
// unlabelled counter, a counter with several series, a histogram and a summary.
const exposition = `# HELP leader_election_master_status Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.
# TYPE leader_election_master_status gauge
leader_election_master_status{name="service-with-healthchecks-controller"} 1
leader_election_master_status{name="other"} 0
# HELP swh_controller_withdrawn_slices_total Slices withdrawn.
# TYPE swh_controller_withdrawn_slices_total counter
swh_controller_withdrawn_slices_total 3
# HELP swh_controller_service_writes_total Service writes.
# TYPE swh_controller_service_writes_total counter
swh_controller_service_writes_total{operation="create"} 5
swh_controller_service_writes_total{operation="update"} 2
# HELP controller_runtime_reconcile_time_seconds Length of time per reconciliation per controller
# TYPE controller_runtime_reconcile_time_seconds histogram
controller_runtime_reconcile_time_seconds_bucket{controller="a",le="0.1"} 4
controller_runtime_reconcile_time_seconds_bucket{controller="a",le="+Inf"} 6
controller_runtime_reconcile_time_seconds_sum{controller="a"} 1.5
controller_runtime_reconcile_time_seconds_count{controller="a"} 6
controller_runtime_reconcile_time_seconds_bucket{controller="b",le="0.1"} 1
controller_runtime_reconcile_time_seconds_bucket{controller="b",le="+Inf"} 1
controller_runtime_reconcile_time_seconds_sum{controller="b"} 0.25
controller_runtime_reconcile_time_seconds_count{controller="b"} 1
# HELP go_gc_duration_seconds A summary of the wall-time pause (stop-the-world) duration in garbage collection cycles.
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0.5"} 0.0001
go_gc_duration_seconds{quantile="1"} 0.002
go_gc_duration_seconds_sum 0.01
go_gc_duration_seconds_count 12
`

func TestValueReadsTheOneSeriesNamedAsTheTextFormatWritesIt(t *testing.T) {
	fams, err := metrics.Parse(strings.NewReader(exposition))
	require.NoError(t, err)
	cases := map[string]struct {
		series  string
		want    float64
		wantErr string
	}{
		"an unlabelled counter reads its value": {
			series: "swh_controller_withdrawn_slices_total", want: 3,
		},
		"a label picks one series of a gauge": {
			series: `leader_election_master_status{name="service-with-healthchecks-controller"}`, want: 1,
		},
		"a label picks a series that reads 0": {
			series: `leader_election_master_status{name="other"}`, want: 0,
		},
		"the count of a histogram is read by its _count name": {
			series: `controller_runtime_reconcile_time_seconds_count{controller="a"}`, want: 6,
		},
		"a bucket of a histogram is read by its le label": {
			series: `controller_runtime_reconcile_time_seconds_bucket{controller="a",le="0.1"}`, want: 4,
		},
		"a quantile of a summary is read by its quantile label": {
			series: `go_gc_duration_seconds{quantile="1"}`, want: 0.002,
		},
		"the count of a summary is read by its _count name": {
			series: "go_gc_duration_seconds_count", want: 12,
		},
		"a name with several series and no labels is an error": {
			series: "swh_controller_service_writes_total", wantErr: "2 series match",
		},
		"a metric that is not exposed is an error": {
			series: "swh_controller_agents_known", wantErr: "not found",
		},
		"a label value no series has is an error": {
			series: `leader_election_master_status{name="nobody"}`, wantErr: "not found",
		},
		"a malformed series is an error": {
			series: `leader_election_master_status{name=}`, wantErr: "is not a series",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := fams.Value(tc.series)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestSumAddsTheSamplesWhoseLabelsMatch(t *testing.T) {
	fams, err := metrics.Parse(strings.NewReader(exposition))
	require.NoError(t, err)
	cases := map[string]struct {
		name   string
		labels map[string]string
		want   float64
	}{
		"every series of a counter":               {name: "swh_controller_service_writes_total", want: 7},
		"the series of a counter with one label":  {name: "swh_controller_service_writes_total", labels: map[string]string{"operation": "update"}, want: 2},
		"the sums of a histogram over its series": {name: "controller_runtime_reconcile_time_seconds_sum", want: 1.75},
		"the counts of a histogram":               {name: "controller_runtime_reconcile_time_seconds_count", want: 7},
		"the +Inf buckets of a histogram":         {name: "controller_runtime_reconcile_time_seconds_bucket", labels: map[string]string{"le": "+Inf"}, want: 7},
		"a metric that is not exposed sums to 0":  {name: "swh_agent_endpointslice_writes_total", want: 0},
		"a label no series has sums to 0":         {name: "swh_controller_service_writes_total", labels: map[string]string{"operation": "delete"}, want: 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, fams.Sum(tc.name, tc.labels))
		})
	}
}

func TestSamplesListsWhatTheTextFormatWrites(t *testing.T) {
	fams, err := metrics.Parse(strings.NewReader(exposition))
	require.NoError(t, err)
	assert.ElementsMatch(t, []metrics.Sample{
		{Labels: map[string]string{"controller": "a", "le": "0.1"}, Value: 4},
		{Labels: map[string]string{"controller": "a", "le": "+Inf"}, Value: 6},
		{Labels: map[string]string{"controller": "b", "le": "0.1"}, Value: 1},
		{Labels: map[string]string{"controller": "b", "le": "+Inf"}, Value: 1},
	}, fams.Samples("controller_runtime_reconcile_time_seconds_bucket"), "a histogram's buckets, +Inf once")
	assert.ElementsMatch(t, []metrics.Sample{
		{Labels: map[string]string{"quantile": "0.5"}, Value: 0.0001},
		{Labels: map[string]string{"quantile": "1"}, Value: 0.002},
	}, fams.Samples("go_gc_duration_seconds"), "a summary's quantiles")
	assert.Empty(t, fams.Samples("go_gc_duration_seconds_bucket"), "a summary has no buckets")
	assert.Empty(t, fams.Samples("controller_runtime_reconcile_time_seconds"), "a histogram has no sample under its own name")
}

func TestGetScrapesAProgramsMetricsAddress(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(exposition))
	}))
	defer srv.Close()
	fams, err := metrics.Get(t.Context(), strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	v, err := fams.Value("swh_controller_withdrawn_slices_total")
	require.NoError(t, err)
	assert.Equal(t, 3.0, v)

	_, err = metrics.Scrape(t.Context(), nil, srv.URL+"/other")
	require.ErrorContains(t, err, "404", "an answer other than 200 is an error")
}
