// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package installed

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// The Grafana dashboards against the live Prometheus: every target expression of every panel
// (rows' panels included), with the dashboard's variables substituted as Grafana would, must
// return at least one series over the fault scenario.

// grafanaDashboard is the part of a dashboard JSON the test reads.
type grafanaDashboard struct {
	Title      string `json:"title"`
	Templating struct {
		List []grafanaVariable `json:"list"`
	} `json:"templating"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaVariable struct {
	Name    string          `json:"name"`
	Type    string          `json:"type"`
	Query   json.RawMessage `json:"query"`
	Options []struct {
		Value string `json:"value"`
	} `json:"options"`
}

type grafanaPanel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a row's panels
}

// panelTarget is one target expression of a panel.
type panelTarget struct {
	panel, refID, expr string
}

// panelTargets lists the target expressions of every panel, rows' panels included, in order.
func panelTargets(panels []grafanaPanel) []panelTarget {
	var out []panelTarget
	for _, p := range panels {
		for i, tg := range p.Targets {
			ref := tg.RefID
			if ref == "" {
				ref = fmt.Sprintf("#%d", i)
			}
			out = append(out, panelTarget{panel: p.Title, refID: ref, expr: tg.Expr})
		}
		out = append(out, panelTargets(p.Panels)...)
	}
	return out
}

// queryText is a variable's query: a string, or an object whose query field is one.
func queryText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", fmt.Errorf("variable query %s: %w", raw, err)
	}
	return obj.Query, nil
}

// labelValuesQuery matches Grafana's label_values(label) and label_values(selector, label).
var labelValuesQuery = regexp.MustCompile(`^\s*label_values\(\s*(?:(.+?)\s*,\s*)?([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)

// parseLabelValues splits a label_values query into its selector (may be empty) and label.
func parseLabelValues(q string) (selector, label string, ok bool) {
	m := labelValuesQuery.FindStringSubmatch(q)
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}

// grafanaInterval is how Grafana writes a duration in $__interval and $__rate_interval.
func grafanaInterval(d time.Duration) string {
	return model.Duration(d).String()
}

// builtins are Grafana's global variables for a query over [start, end] with step (Grafana's
// $__interval) against a data source scraped every scrape: $__rate_interval is
// max($__interval + scrape, 4 x scrape), as Grafana computes it.
func builtins(start, end time.Time, step, scrape time.Duration) map[string]string {
	rate := max(step+scrape, 4*scrape)
	rng := end.Sub(start).Truncate(time.Second)
	return map[string]string{
		"__rate_interval": grafanaInterval(rate),
		"__interval":      grafanaInterval(step),
		"__interval_ms":   fmt.Sprint(step.Milliseconds()),
		"__range":         grafanaInterval(rng),
		"__range_s":       fmt.Sprint(int64(rng.Seconds())),
		"__range_ms":      fmt.Sprint(rng.Milliseconds()),
	}
}

// substitute replaces $name, ${name} (with an optional :format, ignored) and [[name]] by the
// variable's value; longer names first, so $__range_s is not $__range followed by "_s".
func substitute(expr string, vars map[string]string) string {
	names := make([]string, 0, len(vars))
	for n := range vars {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return len(names[i]) > len(names[j]) })
	for _, n := range names {
		v := vars[n]
		expr = regexp.MustCompile(`\$\{`+regexp.QuoteMeta(n)+`(:[^}]*)?\}`).ReplaceAllLiteralString(expr, v)
		expr = strings.ReplaceAll(expr, "[["+n+"]]", v)
		expr = regexp.MustCompile(`\$`+regexp.QuoteMeta(n)+`\b`).ReplaceAllLiteralString(expr, v)
	}
	return expr
}

// regexValue is a multi-value variable with every value selected, as Grafana writes it into a
// =~ matcher.
func regexValue(values []string) string {
	quoted := make([]string, len(values))
	for i, v := range values {
		quoted[i] = regexp.QuoteMeta(v)
	}
	if len(quoted) == 1 {
		return quoted[0]
	}
	return "(" + strings.Join(quoted, "|") + ")"
}

// dashboardFiles are the dashboards of monitoring/grafana-dashboards (one folder deep, as the
// chart reads them).
func dashboardFiles(t *testing.T) []string {
	t.Helper()
	root, err := bundle.Root()
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(root, "monitoring", "grafana-dashboards", "*", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return files
}

// requireDashboardsShowData queries every panel target of every dashboard over [start, end]
// against the live Prometheus, with the dashboard's variables resolved against it (a query
// variable gets every value label_values finds, as "All" selects them), and fails for an
// expression that returns no series: a panel that would show nothing.
func requireDashboardsShowData(t *testing.T, prom *livePrometheus, start, end time.Time) {
	t.Helper()
	step := 2 * time.Second
	for _, f := range dashboardFiles(t) {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		var d grafanaDashboard
		require.NoError(t, json.Unmarshal(data, &d), f)
		vars := builtins(start, end, step, scrapeInterval)
		for _, v := range d.Templating.List {
			value, err := variableValue(t, prom, v, vars, start, end)
			require.NoError(t, err, "%s: variable $%s", filepath.Base(f), v.Name)
			vars[v.Name] = value
		}
		targets := panelTargets(d.Panels)
		require.NotEmpty(t, targets, "%s has panel targets", f)
		for _, tg := range targets {
			q := substitute(tg.expr, vars)
			require.NotContains(t, q, "$", "%s, panel %q %s: every variable is substituted: %s", filepath.Base(f), tg.panel, tg.refID, q)
			v, _, _, err := prom.QueryRange(t.Context(), q, promv1.Range{Start: start, End: end, Step: step})
			if !assert.NoError(t, err, "%s, panel %q %s: %s", filepath.Base(f), tg.panel, tg.refID, q) {
				continue
			}
			m, ok := v.(model.Matrix)
			if assert.True(t, ok, "%s: a matrix", q) {
				assert.NotEmpty(t, m, "%s, panel %q %s shows nothing over the scenario: %s", filepath.Base(f), tg.panel, tg.refID, q)
			}
		}
		t.Logf("%s: %d panel targets queried", filepath.Base(f), len(targets))
	}
}

// variableValue resolves one template variable: a datasource variable is the Prometheus itself
// (no expression names it); a query variable (label_values) is every value Prometheus has for
// the label over the range; a custom or constant variable its options or query.
func variableValue(t *testing.T, prom *livePrometheus, v grafanaVariable, vars map[string]string, start, end time.Time) (string, error) {
	t.Helper()
	q, err := queryText(v.Query)
	if err != nil {
		return "", err
	}
	switch v.Type {
	case "datasource":
		if q != "prometheus" {
			return "", fmt.Errorf("a datasource variable of type %q, not prometheus", q)
		}
		return "", nil
	case "query":
		selector, label, ok := parseLabelValues(substitute(q, vars))
		if !ok {
			return "", fmt.Errorf("query %q: only label_values(...) is resolved by this test", q)
		}
		var matches []string
		if selector != "" {
			matches = []string{selector}
		}
		values, _, _, err := prom.LabelValues(t.Context(), label, matches, start, end)
		if err != nil {
			return "", fmt.Errorf("label_values(%s, %s): %w", selector, label, err)
		}
		if len(values) == 0 {
			return "", fmt.Errorf("label_values(%s, %s) has no values: the dashboard would show nothing", selector, label)
		}
		s := make([]string, len(values))
		for i, lv := range values {
			s[i] = string(lv)
		}
		return regexValue(s), nil
	case "custom":
		var s []string
		for _, o := range v.Options {
			if o.Value != "$__all" {
				s = append(s, o.Value)
			}
		}
		if len(s) == 0 {
			s = strings.Split(q, ",")
		}
		return regexValue(s), nil
	case "constant", "textbox":
		return q, nil
	}
	return "", fmt.Errorf("variable type %q is not resolved by this test", v.Type)
}

func TestPanelTargetsIncludeRows(t *testing.T) {
	var d grafanaDashboard
	require.NoError(t, json.Unmarshal([]byte(`{"panels": [
		{"title": "a", "targets": [{"expr": "up", "refId": "A"}, {"expr": "x"}]},
		{"title": "row", "type": "row", "panels": [{"title": "b", "targets": [{"expr": "y", "refId": "B"}]}]}
	]}`), &d))
	assert.Equal(t, []panelTarget{
		{panel: "a", refID: "A", expr: "up"}, {panel: "a", refID: "#1", expr: "x"}, {panel: "b", refID: "B", expr: "y"},
	}, panelTargets(d.Panels))
}

func TestSubstitute(t *testing.T) {
	vars := map[string]string{"pod": "(a|b)", "__range": "1m", "__range_s": "60", "__rate_interval": "4s"}
	for _, tc := range []struct{ in, want string }{
		{`rate(x{pod=~"$pod"}[$__rate_interval])`, `rate(x{pod=~"(a|b)"}[4s])`},
		{`x{pod=~"${pod}"} / ${pod:regex}`, `x{pod=~"(a|b)"} / (a|b)`},
		{`x{pod=~"[[pod]]"}`, `x{pod=~"(a|b)"}`},
		{`increase(x[$__range]) / $__range_s`, `increase(x[1m]) / 60`},
		{`x{podname="$podname"}`, `x{podname="$podname"}`},
		{`no variables`, `no variables`},
	} {
		assert.Equal(t, tc.want, substitute(tc.in, vars), tc.in)
	}
}

func TestBuiltinsFollowGrafana(t *testing.T) {
	start := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		step, scrape time.Duration
		rate         string
	}{
		{2 * time.Second, time.Second, "4s"},
		{time.Minute, 15 * time.Second, "1m15s"},
		{15 * time.Second, 30 * time.Second, "2m"},
	} {
		b := builtins(start, start.Add(90*time.Second), tc.step, tc.scrape)
		assert.Equal(t, tc.rate, b["__rate_interval"], "step %s, scrape %s", tc.step, tc.scrape)
		assert.Equal(t, "1m30s", b["__range"])
		assert.Equal(t, "90", b["__range_s"])
	}
}

func TestParseLabelValues(t *testing.T) {
	for _, tc := range []struct {
		in, selector, label string
		ok                  bool
	}{
		{`label_values(swh_agent_probe_targets, pod)`, "swh_agent_probe_targets", "pod", true},
		{`label_values(m{namespace=~"(a|b)"}, name)`, `m{namespace=~"(a|b)"}`, "name", true},
		{`label_values(job)`, "", "job", true},
		{`query_result(up)`, "", "", false},
	} {
		selector, label, ok := parseLabelValues(tc.in)
		assert.Equal(t, tc.ok, ok, tc.in)
		assert.Equal(t, tc.selector, selector, tc.in)
		assert.Equal(t, tc.label, label, tc.in)
	}
}

func TestRegexValue(t *testing.T) {
	assert.Equal(t, "a", regexValue([]string{"a"}))
	assert.Equal(t, `(agent-node-a|d8\.x)`, regexValue([]string{"agent-node-a", "d8.x"}))
}
