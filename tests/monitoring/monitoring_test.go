// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package monitoring

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// fromElsewhere are metrics the rules and dashboards use that the programs' own collectors do
// not describe, with where they come from.
var fromElsewhere = map[string]string{
	// controller-runtime registers these in its global registry (not through the program's
	// Registry option), so describe-metrics cannot list them.
	"leader_election_master_status": "controller-runtime (client-go leader election), name = the Lease",
	"workqueue_depth":               "controller-runtime work queue, name = the controller",
	// kube-state-metrics (Deckhouse's monitoring-kubernetes module).
	"kube_daemonset_status_number_unavailable": "kube-state-metrics, DaemonSet status",
	// The module's credentials hook exports it through Deckhouse (hooks/credentials).
	"d8_service_with_healthchecks_credential_secret_problem": "the module's credentials hook, exported by Deckhouse",
}

// Metric is one line of a program's describe-metrics output.
type Metric struct {
	Program, Name, Type, Labels, Help string
}

var (
	describeOnce sync.Once
	described    []Metric
	describeErr  error
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.work"))
	require.NoError(t, err, "the repository root holds go.work")
	return root
}

// programMetrics builds both programs and runs their describe-metrics command.
func programMetrics(t *testing.T) []Metric {
	t.Helper()
	root := repoRoot(t)
	describeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "swh-describe-")
		if err != nil {
			describeErr = err
			return
		}
		defer os.RemoveAll(dir)
		for _, p := range []string{"controller", "agent"} {
			bin := filepath.Join(dir, p)
			build := exec.Command("go", "build", "-o", bin, "./cmd/"+p)
			build.Dir = filepath.Join(root, "images", p)
			if out, err := build.CombinedOutput(); err != nil {
				describeErr = fmt.Errorf("building %s: %w\n%s", p, err, out)
				return
			}
			var stdout, stderr bytes.Buffer
			run := exec.Command(bin, "describe-metrics")
			run.Stdout, run.Stderr = &stdout, &stderr
			if err := run.Run(); err != nil {
				describeErr = fmt.Errorf("%s describe-metrics: %w\n%s", p, err, stderr.String())
				return
			}
			for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
				f := strings.SplitN(line, "\t", 4)
				if len(f) != 4 {
					describeErr = fmt.Errorf("%s describe-metrics: bad line %q", p, line)
					return
				}
				described = append(described, Metric{Program: p, Name: f[0], Type: f[1], Labels: f[2], Help: f[3]})
			}
		}
	})
	require.NoError(t, describeErr)
	require.NotEmpty(t, described)
	return described
}

// series are the names a metric exposes: a histogram also _bucket, _sum and _count.
func series(m Metric) []string {
	if m.Type == "histogram" {
		return []string{m.Name + "_bucket", m.Name + "_sum", m.Name + "_count"}
	}
	return []string{m.Name}
}

// Rule is an alerting rule of monitoring/prometheus-rules.
type Rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// Group is a rule group.
type Group struct {
	Name  string `json:"name"`
	Rules []Rule `json:"rules"`
}

func ruleFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "monitoring", "prometheus-rules", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return files
}

// rules reads every rule file (Deckhouse style: a list of groups per file).
func rules(t *testing.T) map[string][]Group {
	t.Helper()
	out := map[string][]Group{}
	for _, f := range ruleFiles(t) {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		var groups []Group
		require.NoError(t, yaml.UnmarshalStrict(data, &groups), f)
		out[f] = groups
	}
	return out
}

func alerts(t *testing.T) []Rule {
	t.Helper()
	var out []Rule
	for _, groups := range rules(t) {
		for _, g := range groups {
			out = append(out, g.Rules...)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Alert < out[j].Alert })
	return out
}

// grafanaVars are Grafana's interval variables, replaced by durations before parsing.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// dashboardExprs returns "file: panel" -> expression for every target of every dashboard.
func dashboardExprs(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "monitoring", "grafana-dashboards", "*", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	out := map[string]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		var d struct {
			Templating struct {
				List []struct {
					Name  string `json:"name"`
					Type  string `json:"type"`
					Query any    `json:"query"`
				} `json:"list"`
			} `json:"templating"`
			Panels []struct {
				Title      string `json:"title"`
				Datasource struct {
					UID string `json:"uid"`
				} `json:"datasource"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		require.NoError(t, json.Unmarshal(data, &d), f)
		hasDS := false
		for _, v := range d.Templating.List {
			if v.Name == "ds_prometheus" && v.Type == "datasource" {
				hasDS = true
			}
		}
		require.True(t, hasDS, "%s: the $ds_prometheus datasource variable", f)
		for _, p := range d.Panels {
			require.Equal(t, "${ds_prometheus}", p.Datasource.UID, "%s: panel %q uses $ds_prometheus", f, p.Title)
			require.NotEmpty(t, p.Targets, "%s: panel %q has targets", f, p.Title)
			for i, tg := range p.Targets {
				out[fmt.Sprintf("%s: %s #%d", filepath.Base(f), p.Title, i)] = tg.Expr
			}
		}
	}
	return out
}

var labelValuesPattern = regexp.MustCompile(`^label_values\((?:(.+), )?\w+\)$`)

// metricNames parses expr and returns the metric names its selectors name.
func metricNames(expr string) ([]string, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVars.Replace(expr))
	if err != nil {
		return nil, err
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			names = append(names, vs.Name)
		}
		return nil
	})
	return names, nil
}

// TestEveryExpressionParsesAndNamesKnownMetrics: rules and dashboards only use metrics that
// exist.
func TestEveryExpressionParsesAndNamesKnownMetrics(t *testing.T) {
	known := map[string]bool{}
	for _, m := range programMetrics(t) {
		for _, s := range series(m) {
			known[s] = true
		}
	}
	for name := range fromElsewhere {
		require.False(t, known[name], "%s is described by a program: drop it from the allow-list", name)
		known[name] = true
	}
	exprs := map[string]string{}
	for _, a := range alerts(t) {
		exprs["alert "+a.Alert] = a.Expr
	}
	for where, e := range dashboardExprs(t) {
		exprs[where] = e
	}
	used := map[string]bool{}
	for where, expr := range exprs {
		t.Run(where, func(t *testing.T) {
			names, err := metricNames(expr)
			require.NoError(t, err, "%s does not parse", expr)
			require.NotEmpty(t, names, "%s names a metric", expr)
			for _, n := range names {
				used[n] = true
				assert.True(t, known[n], "metric %s is neither registered by a program nor allow-listed", n)
			}
		})
	}
	for name := range fromElsewhere {
		assert.True(t, used[name], "allow-listed %s is not used any more: drop it", name)
	}
}

// TestTheCheckCatchesUnknownMetricsAndBadSyntax proves the test above can fail.
func TestTheCheckCatchesUnknownMetricsAndBadSyntax(t *testing.T) {
	_, err := metricNames(`sum(rate(swh_agent_probe_results_total[5m]`)
	require.Error(t, err, "an unbalanced expression does not parse")
	names, err := metricNames(`rate(swh_agent_no_such_metric_total[$__rate_interval]) > on() group_left swh_controller_agents_known`)
	require.NoError(t, err)
	assert.Equal(t, []string{"swh_agent_no_such_metric_total", "swh_controller_agents_known"}, names)
	for _, m := range programMetrics(t) {
		assert.NotEqual(t, "swh_agent_no_such_metric_total", m.Name)
	}
}

// TestDashboardVariablesQueryKnownMetrics: label_values(<selector>, label) variables.
func TestDashboardVariablesQueryKnownMetrics(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "monitoring", "grafana-dashboards", "*", "*.json"))
	require.NoError(t, err)
	known := map[string]bool{}
	for _, m := range programMetrics(t) {
		known[m.Name] = true
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		var d struct {
			Templating struct {
				List []struct {
					Name  string `json:"name"`
					Type  string `json:"type"`
					Query struct {
						Query string `json:"query"`
					} `json:"query"`
				} `json:"list"`
			} `json:"templating"`
		}
		if err := json.Unmarshal(data, &d); err != nil {
			continue // a datasource variable's query is a string; checked above
		}
		for _, v := range d.Templating.List {
			if v.Type != "query" {
				continue
			}
			m := labelValuesPattern.FindStringSubmatch(v.Query.Query)
			require.NotNil(t, m, "%s: variable %s is a label_values query", f, v.Name)
			names, err := metricNames(m[1])
			require.NoError(t, err)
			for _, n := range names {
				assert.True(t, known[n], "%s: variable %s queries unknown metric %s", f, v.Name, n)
			}
		}
	}
}

// TestEveryAlertIsActionable: a severity Deckhouse understands, tier cluster, a summary and a
// description; the name says it is ours.
func TestEveryAlertIsActionable(t *testing.T) {
	as := alerts(t)
	require.NotEmpty(t, as)
	for _, a := range as {
		t.Run(a.Alert, func(t *testing.T) {
			assert.True(t, strings.HasPrefix(a.Alert, "D8ServiceWithHealthchecks"))
			assert.Contains(t, []string{"3", "4", "5", "6", "7", "8", "9"}, a.Labels["severity_level"])
			assert.Equal(t, "cluster", a.Labels["tier"])
			assert.NotEmpty(t, a.Annotations["summary"])
			assert.Contains(t, a.Annotations["description"], "heck", "the description says what to check")
			assert.NotEmpty(t, a.For, "alerts wait before firing")
		})
	}
}

// promtool finds (building when missing) promtool, which the tools/kube group builds beside the
// Kubernetes binaries (they share client-go, gRPC and protobuf: one compile on a fresh machine).
func promtool(t *testing.T) string {
	t.Helper()
	root := repoRoot(t)
	build := exec.Command("bash", filepath.Join(root, "tools", "build.sh"), "kube")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "tools/build.sh kube: %s", out)
	dir, err := exec.Command("bash", filepath.Join(root, "tools", "build.sh"), "--dir", "kube").Output()
	require.NoError(t, err)
	bin := filepath.Join(strings.TrimSpace(string(dir)), "promtool")
	_, err = os.Stat(bin)
	require.NoError(t, err)
	return bin
}

// wrapped writes each rule file as promtool reads rules (a groups: key) into a temporary
// folder, with the rule unit tests beside them, and returns the folder.
func wrapped(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for f, groups := range rules(t) {
		data, err := yaml.Marshal(map[string]any{"groups": groups})
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(f)), data, 0o600))
	}
	tests, err := filepath.Glob(filepath.Join(repoRoot(t), "monitoring", "prometheus-rules", "tests", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, tests)
	require.NoError(t, os.Mkdir(filepath.Join(dir, "tests"), 0o700))
	for _, f := range tests {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		var doc map[string]any
		require.NoError(t, yaml.Unmarshal(data, &doc))
		// rule_files are named relative to the rule folder.
		files, _ := doc["rule_files"].([]any)
		for i, rf := range files {
			files[i] = filepath.Join(dir, rf.(string))
		}
		out, err := yaml.Marshal(doc)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "tests", filepath.Base(f)), out, 0o600))
	}
	return dir
}

// TestPromtoolChecksAndUnitTestsPass runs promtool check rules and promtool test rules.
func TestPromtoolChecksAndUnitTestsPass(t *testing.T) {
	bin := promtool(t)
	dir := wrapped(t)
	ruleFiles, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	require.NoError(t, err)
	check := exec.Command(bin, append([]string{"check", "rules"}, ruleFiles...)...)
	out, err := check.CombinedOutput()
	require.NoError(t, err, "promtool check rules:\n%s", out)

	tests, err := filepath.Glob(filepath.Join(dir, "tests", "*.yaml"))
	require.NoError(t, err)
	run := exec.Command(bin, append([]string{"test", "rules"}, tests...)...)
	out, err = run.CombinedOutput()
	require.NoError(t, err, "promtool test rules:\n%s", out)
	t.Logf("promtool test rules:\n%s", out)

	// The unit tests can fail: a wrong expectation makes promtool fail.
	broken := filepath.Join(dir, "tests", "broken.yaml")
	data, err := os.ReadFile(tests[0])
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(broken, bytes.Replace(data, []byte("tier: cluster"), []byte("tier: nowhere"), 1), 0o600))
	out, err = exec.Command(bin, "test", "rules", broken).CombinedOutput()
	require.Error(t, err, "a wrong expected label fails promtool:\n%s", out)
}

// TestEveryAlertHasAFiringAndAQuietCase reads the unit tests: every alert is expected to fire
// in some case and expected not to fire in another.
func TestEveryAlertHasAFiringAndAQuietCase(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "monitoring", "prometheus-rules", "tests", "*.yaml"))
	require.NoError(t, err)
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		var doc struct {
			Tests []struct {
				AlertRuleTest []struct {
					Alertname string `json:"alertname"`
					ExpAlerts []any  `json:"exp_alerts"`
				} `json:"alert_rule_test"`
			} `json:"tests"`
		}
		require.NoError(t, yaml.Unmarshal(data, &doc))
		for _, tc := range doc.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.Alertname] = true
				} else {
					quiet[a.Alertname] = true
				}
			}
		}
	}
	for _, a := range alerts(t) {
		assert.True(t, fires[a.Alert], "%s has a case where it fires", a.Alert)
		assert.True(t, quiet[a.Alert], "%s has a case where it does not fire", a.Alert)
	}
}

// docRow is a metric row of docs/METRICS*.md: | `name` | type | `label`, ... | meaning |.
var docRow = regexp.MustCompile("^\\| `([a-z_:][a-z0-9_:]*)` \\| (counter|gauge|histogram|summary) \\| ([^|]*) \\|")

// alertRow is an alert row: | `D8ServiceWithHealthchecks...` | ...
var alertRow = regexp.MustCompile("^\\| `(D8ServiceWithHealthchecks\\w+)` \\|")

var backticked = regexp.MustCompile("`([^`]+)`")

// TestMetricsDocsListExactlyTheProgramsMetrics: both directions, with type and labels, in both
// languages; and every alert is listed.
func TestMetricsDocsListExactlyTheProgramsMetrics(t *testing.T) {
	want := map[string]string{}
	for _, m := range programMetrics(t) {
		labels := "-"
		if m.Labels != "-" {
			labels = m.Labels
		}
		want[m.Name] = m.Type + " " + labels
	}
	var alertNames []string
	for _, a := range alerts(t) {
		alertNames = append(alertNames, a.Alert)
	}
	for _, doc := range []string{"METRICS.md", "METRICS.ru.md"} {
		t.Run(doc, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", doc))
			require.NoError(t, err)
			got := map[string]string{}
			var docAlerts []string
			for _, line := range strings.Split(string(data), "\n") {
				if m := docRow.FindStringSubmatch(line); m != nil {
					var labels []string
					for _, l := range backticked.FindAllStringSubmatch(m[3], -1) {
						labels = append(labels, l[1])
					}
					ls := strings.Join(labels, ",")
					if ls == "" {
						ls = "-"
					}
					require.NotContains(t, got, m[1], "%s is listed once", m[1])
					got[m[1]] = m[2] + " " + ls
				}
				if m := alertRow.FindStringSubmatch(line); m != nil {
					docAlerts = append(docAlerts, m[1])
				}
			}
			assert.Equal(t, want, got, "%s lists every metric of the programs, with type and labels, and no other", doc)
			slices.Sort(docAlerts)
			assert.Equal(t, alertNames, docAlerts, "%s lists every alert", doc)
		})
	}
}
