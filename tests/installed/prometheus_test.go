// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package installed

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/deckhouse/service-with-healthchecks/api/slicemeta"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/loopback"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// The live Prometheus (development/TEST-HARNESS.md, "A real Prometheus"): it scrapes and
// evaluates every second, and every rule's `for:` becomes liveFor. The rules' expressions are
// loaded verbatim; their `for:` windows (1 to 15 minutes) are held by promtool's unit tests
// (tests/monitoring), which a test of a few minutes cannot wait out.
const (
	scrapeInterval = time.Second
	liveFor        = "2s"
	// alertDeadline bounds every wait for an alert to fire or resolve.
	alertDeadline = 90 * time.Second
)

// noFault are the alerts of monitoring/prometheus-rules no fault of this test can fire, with
// why. Every other alert has a case in TestPrometheusSeesTheFaultsOfTheInstalledChart.
var noFault = map[string]string{
	"D8ServiceWithHealthchecksAgentPodsUnavailable": "its metric kube_daemonset_status_number_unavailable comes from " +
		"kube-state-metrics reading the DaemonSet status the DaemonSet controller writes; neither runs here (envtest has " +
		"no kube-controller-manager, the test places the agent pods itself), so no DaemonSet status exists to count " +
		"unavailable pods in. Its expression and window are held by promtool's unit tests (tests/monitoring).",
	"D8ServiceWithHealthchecksCredentialSecretMisconfigured": "its metric d8_service_with_healthchecks_credential_secret_problem " +
		"is exported by Deckhouse (shell-operator's metrics of the module's credentials hook), which does not run here; " +
		"the hook's metric is unit-tested in hooks/credentials and the alert by promtool. The agent's own view of the " +
		"same fault (D8ServiceWithHealthchecksCredentialSecretProblem) fires here.",
}

// quietWindow is the range of the queries that show a counter stopped rising after a fault.
const quietWindow = "5s"

// alertCase is one alert with the labels that name the fault's instance. quiet, for the
// alerts over a rate or increase window (5 or 15 minutes, which stay above zero that long
// after the last increase, longer than this test), is a query that returns nothing once the
// fault has ended: the counter behind the alert stopped rising. The others must resolve.
type alertCase struct {
	alert  string
	labels model.LabelSet
	quiet  string
}

// TestPrometheusSeesTheFaultsOfTheInstalledChart runs the real Prometheus (built by
// tools/build.sh kube) against the chart as installed: it scrapes the controller and both
// agents through their kube-rbac-proxy sidecars with the platform's prometheus token (the
// chart's Role allows it), is refused without a token and with another account's, loads
// monitoring/prometheus-rules with every `for:` shortened to liveFor and expressions verbatim,
// and then real faults fire every alert that can fire here (noFault says why the others
// cannot) and the alerts resolve after the faults end:
//
//   - a port whose only endpoint fails its probe (PortHasNoReadyEndpoint), a port with one of
//     three endpoints ready (PortDegraded);
//   - a hanging tenant on node-b whose probes time out while the agent has two workers
//     (ProbesLate);
//   - a PostgreSQL probe whose credential Secret does not exist (CredentialSecretProblem), an
//     HTTPS probe whose CA certificate cannot be read (ProbesCannotRun);
//   - admission policies that refuse the module's writes in a namespace: the child Service
//     create and the status update (ControllerWritesFailing, StatusWritesFailing) in one, the
//     agent's slice writes in another (EndpointSliceWritesFailing);
//   - a slice forged with node-a's agent credentials (ForgedEndpointSlice);
//   - a Service of the resource's name owned by someone else (no alert: the conflict shows on
//     the controller dashboard);
//   - node-b's agent stopped (AgentStale), then node-a's too (LivenessGuardHolding, and
//     AgentStale gives way to it), then both started again;
//   - the controller stopped (ControllerHasNoLeader) and started again.
//
// At the end every dashboard panel is queried over the scenario (dashboards_test.go).
func TestPrometheusSeesTheFaultsOfTheInstalledChart(t *testing.T) {
	began := time.Now()
	mc := documentedModuleConfig(t)
	// The agents renew every second and the controller judges them stale after 4 s (the
	// smallest grace the settings take), and an agent has two probe workers, so a hanging tenant
	// makes its probes late: both are settings a user writes.
	mc.Spec.Settings["agentLostGrace"] = "4s"
	agentSettings, ok := mc.Spec.Settings["agent"].(map[string]any)
	require.True(t, ok, "the documented ModuleConfig has agent settings")
	agentSettings["probeConcurrency"] = 2
	inst := install(t, mc)
	ctx := t.Context()
	kube := inst.kube
	t.Logf("installed in %s", time.Since(began).Round(time.Millisecond))

	// The platform's Prometheus: the chart's PodMonitors turned into scrape jobs, with the token
	// of the account the chart's Role allows; two more jobs scrape the sidecars without a token
	// and with another account's.
	prom := startPrometheus(t, inst, accountToken(t, kube, prometheusAccount), accountToken(t, kube, otherAccount))
	requireTargets(t, prom)
	t.Logf("Prometheus scrapes every sidecar at %s", time.Since(began).Round(time.Millisecond))

	// The tenants, healthy first.
	down := addTenant(t, inst, "down", []string{"node-a"}, httpHealthcheck(1))
	degraded := addTenant(t, inst, "degraded", []string{"node-a", "node-a", "node-a"}, httpHealthcheck(1))
	late := addTenant(t, inst, "late", []string{"node-b"}, lateHealthcheck)
	web := addTenant(t, inst, "web", []string{"node-a", "node-b"}, httpHealthcheck(1))
	for _, tn := range []*tenant{down, degraded, late, web} {
		tn.create(t)
	}
	for _, tn := range []*tenant{down, degraded, late, web} {
		tn.waitReady(t, len(tn.pods))
	}
	t.Logf("tenants ready at %s", time.Since(began).Round(time.Millisecond))

	// The faults.
	down.servers[0].SetHTTPStatus(http.StatusServiceUnavailable)
	degraded.servers[1].SetHTTPStatus(http.StatusServiceUnavailable)
	degraded.servers[2].SetHTTPStatus(http.StatusServiceUnavailable)
	late.servers[0].SetDelay(3 * time.Second)
	creds := addTenant(t, inst, "creds", []string{"node-a"}, `
    periodSeconds: 1
    probes:
    - mode: PostgreSQL
      timeoutSeconds: 1
      postgreSQL:
        targetPort: 8080
        authSecretName: missing-credentials`)
	creds.create(t)
	// A CA certificate the API server takes (it looks like PEM) but no TLS library can read: the
	// probe cannot be built.
	badCA := addTenant(t, inst, "bad-ca", []string{"node-a"}, `
    periodSeconds: 1
    probes:
    - mode: HTTP
      http:
        targetPort: 8080
        scheme: HTTPS
        caCert: |
          -----BEGIN CERTIFICATE-----
          bm90IGEgY2VydGlmaWNhdGU=
          -----END CERTIFICATE-----`)
	badCA.create(t)
	probeService := &corev1.Service{Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
	refused := addTenant(t, inst, "refused", []string{"node-a"}, httpHealthcheck(1))
	allowController := refuseModuleWrites(t, inst, refused.ns, probeService, serviceCreate, statusUpdate)
	refused.create(t)
	// The agent writes a resource's slices once its child Service exists: its refusal needs a
	// namespace of its own.
	probeSlice := &discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4}
	refusedSlices := addTenant(t, inst, "refused-slices", []string{"node-a"}, httpHealthcheck(1))
	allowAgent := refuseModuleWrites(t, inst, refusedSlices.ns, probeSlice, sliceWrite)
	refusedSlices.create(t)
	conflict := addTenant(t, inst, "conflict", []string{"node-a"}, httpHealthcheck(1))
	foreign := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: conflict.ns, Name: "web"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}
	require.NoError(t, inst.admin.Create(ctx, foreign), "someone else's Service of the resource's name")
	conflict.create(t)
	forged := forgeSlice(t, inst, web)

	faults := []alertCase{
		{alert: "D8ServiceWithHealthchecksPortHasNoReadyEndpoint", labels: model.LabelSet{"namespace": model.LabelValue(down.ns), "port": "http"}},
		{alert: "D8ServiceWithHealthchecksPortDegraded", labels: model.LabelSet{"namespace": model.LabelValue(degraded.ns), "port": "http"}},
		{
			alert: "D8ServiceWithHealthchecksProbesLate", labels: model.LabelSet{"pod": "agent-node-b"},
			quiet: `sum(increase(swh_agent_probe_late_runs_total{pod="agent-node-b"}[` + quietWindow + `])) > 0`,
		},
		{
			alert: "D8ServiceWithHealthchecksProbesCannotRun", labels: model.LabelSet{"pod": "agent-node-a", "mode": "HTTP"},
			quiet: `sum(increase(swh_agent_probe_results_total{pod="agent-node-a", mode="HTTP", outcome="error"}[` + quietWindow + `])) > 0`,
		},
		// The chart's hook grants the agent only credential Secrets that exist, so a missing one
		// is unreadable to it (the module's hook reports it as Missing, noFault).
		{alert: "D8ServiceWithHealthchecksCredentialSecretProblem", labels: model.LabelSet{"problem": "unreadable"}},
		{
			alert: "D8ServiceWithHealthchecksControllerWritesFailing", labels: model.LabelSet{"operation": "create_service"},
			quiet: `sum(increase(swh_controller_errors_total{operation="create_service"}[` + quietWindow + `])) > 0`,
		},
		{
			alert: "D8ServiceWithHealthchecksStatusWritesFailing",
			quiet: `sum(increase(swh_controller_errors_total{operation="update_status"}[` + quietWindow + `])) > 0`,
		},
		{
			alert: "D8ServiceWithHealthchecksEndpointSliceWritesFailing", labels: model.LabelSet{"pod": "agent-node-a"},
			quiet: `sum(increase(swh_agent_endpointslice_write_errors_total{pod="agent-node-a"}[` + quietWindow + `])) > 0`,
		},
		{
			alert: "D8ServiceWithHealthchecksForgedEndpointSlice",
			quiet: `sum(increase(swh_controller_forged_endpointslices_total[` + quietWindow + `])) > 0`,
		},
	}
	for _, f := range faults {
		waitAlert(t, prom, f, true)
	}
	t.Logf("every tenant fault's alert fires at %s", time.Since(began).Round(time.Millisecond))
	// The forged slice is gone (the audit deleted it), and the foreign Service shows as a
	// conflict on the controller dashboard.
	err := inst.admin.Get(ctx, client.ObjectKeyFromObject(forged), &discoveryv1.EndpointSlice{})
	assert.True(t, apierrors.IsNotFound(err), "the audit deleted the forged slice (%v)", err)
	waitQuery(t, prom, `swh_controller_conflicts_total{kind="foreign_service"} > 0`, true)

	// The faults end.
	down.servers[0].SetHTTPStatus(http.StatusOK)
	degraded.servers[1].SetHTTPStatus(http.StatusOK)
	degraded.servers[2].SetHTTPStatus(http.StatusOK)
	late.servers[0].SetDelay(0)
	require.NoError(t, inst.admin.Delete(ctx, creds.swh), "the resource whose Secret is missing goes")
	require.NoError(t, inst.admin.Delete(ctx, badCA.swh), "the resource with the broken CA goes")
	allowController()
	allowAgent()
	require.NoError(t, inst.admin.Delete(ctx, foreign), "the foreign Service goes")
	for _, f := range faults {
		if f.quiet == "" {
			waitAlert(t, prom, f, false)
		} else {
			waitQuery(t, prom, f.quiet, false)
		}
	}
	refused.waitReady(t, 1)
	refusedSlices.waitReady(t, 1)
	conflict.waitReady(t, 1)
	t.Logf("every tenant fault has ended at %s", time.Since(began).Round(time.Millisecond))

	// An agent stops: its node's endpoints are withdrawn and AgentStale fires. When the other one
	// stops too, more than half look stale: the guard holds and AgentStale gives way to
	// LivenessGuardHolding. Both start again and everything resolves.
	agentA, agentB := inst.proc(t, "agent-node-a", "agent"), inst.proc(t, "agent-node-b", "agent")
	stale := alertCase{alert: "D8ServiceWithHealthchecksAgentStale", labels: model.LabelSet{"node": "node-b"}}
	guard := alertCase{alert: "D8ServiceWithHealthchecksLivenessGuardHolding"}
	agentB.Stop(t)
	waitAlert(t, prom, stale, true)
	web.waitWithdrawn(t, "node-b")
	agentA.Stop(t)
	waitAlert(t, prom, guard, true)
	waitAlert(t, prom, alertCase{alert: stale.alert}, false)
	agentA.Start(t)
	agentB.Start(t)
	waitAlert(t, prom, guard, false)
	waitAlert(t, prom, alertCase{alert: stale.alert}, false)
	web.waitReady(t, 2)
	t.Logf("agent faults fired and resolved at %s", time.Since(began).Round(time.Millisecond))

	// The controller stops: no replica leads. It starts again and leads.
	ctrl := inst.proc(t, "controller-0", "controller")
	noLeader := alertCase{alert: "D8ServiceWithHealthchecksControllerHasNoLeader"}
	ctrl.Stop(t)
	waitAlert(t, prom, noLeader, true)
	ctrl.Start(t)
	waitAlert(t, prom, noLeader, false)
	t.Logf("controller fault fired and resolved at %s", time.Since(began).Round(time.Millisecond))

	// Every alert of the rules fired on its fault above, or says why no fault can fire it.
	fired := []string{stale.alert, guard.alert, noLeader.alert}
	for _, f := range faults {
		fired = append(fired, f.alert)
	}
	requireEveryAlertCovered(t, ruleAlerts(t), fired)

	t.Run("every dashboard panel shows data", func(t *testing.T) {
		requireDashboardsShowData(t, prom, prom.started, time.Now())
	})
	t.Logf("the whole test took %s", time.Since(began).Round(time.Millisecond))
}

// requireEveryAlertCovered fails for an alert that neither fired on a fault nor has a reason in
// noFault, and for a reason in noFault of an alert that is not in the rules or fired after all.
func requireEveryAlertCovered(t *testing.T, inRules, fired []string) {
	t.Helper()
	for _, a := range inRules {
		_, reason := noFault[a]
		assert.True(t, slices.Contains(fired, a) != reason, "alert %s: a fault fired it (%v) or noFault says why none can (%v), exactly one", a, slices.Contains(fired, a), reason)
	}
	for a := range noFault {
		assert.Contains(t, inRules, a, "noFault names an alert of the rules")
	}
}

// livePrometheus is the running Prometheus and its HTTP API.
type livePrometheus struct {
	promv1.API
	addr    string
	started time.Time
}

// startPrometheus starts the real Prometheus on a free loopback port with a temporary folder of
// its own (configuration, tokens, rules, TSDB); it is stopped by PID when the test ends.
func startPrometheus(t *testing.T, inst *installation, promToken, otherToken string) *livePrometheus {
	t.Helper()
	bin := toolBinary(t, "kube", "prometheus")
	dir := t.TempDir()
	tokenFile, otherFile := filepath.Join(dir, "prometheus.token"), filepath.Join(dir, "grafana.token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(promToken), 0o600))
	require.NoError(t, os.WriteFile(otherFile, []byte(otherToken), 0o600))

	rulesFile := filepath.Join(dir, "rules.yaml")
	root, err := bundle.Root()
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(root, "monitoring", "prometheus-rules", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	sources := map[string][]byte{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		sources[filepath.Base(f)] = data
	}
	rules, err := liveRules(sources, scrapeInterval, liveFor)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(rulesFile, rules, 0o600))

	jobs := podMonitorJobs(t, inst, tokenFile)
	// The refusals: every sidecar scraped without a token and with another account's token.
	var all []string
	for _, j := range jobs {
		for _, sc := range j["static_configs"].([]map[string]any) {
			all = append(all, sc["targets"].([]string)...)
		}
	}
	tlsInsecure := map[string]any{"insecure_skip_verify": true}
	jobs = append(jobs,
		map[string]any{"job_name": "refused/no-token", "scheme": "https", "tls_config": tlsInsecure,
			"static_configs": []map[string]any{{"targets": all}}},
		map[string]any{"job_name": "refused/other-account", "scheme": "https", "tls_config": tlsInsecure,
			"authorization":  map[string]any{"type": "Bearer", "credentials_file": otherFile},
			"static_configs": []map[string]any{{"targets": all}}},
	)
	cfg, err := yaml.Marshal(map[string]any{
		"global": map[string]any{
			"scrape_interval": scrapeInterval.String(), "scrape_timeout": scrapeInterval.String(),
			"evaluation_interval": scrapeInterval.String(),
		},
		"rule_files":     []string{rulesFile},
		"scrape_configs": jobs,
	})
	require.NoError(t, err)
	cfgFile := filepath.Join(dir, "prometheus.yaml")
	require.NoError(t, os.WriteFile(cfgFile, cfg, 0o600))

	addr, err := loopback.FreeAddr()
	require.NoError(t, err)
	cmd := exec.Command(bin, "--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	started := time.Now()
	p := process.StartForTest(t, "prometheus", cmd)
	waitCtx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	require.NoError(t, p.WaitHTTP(waitCtx, "http://"+addr+"/-/ready"), "Prometheus becomes ready")
	c, err := promapi.NewClient(promapi.Config{Address: "http://" + addr})
	require.NoError(t, err)
	t.Logf("Prometheus (pid %d) on %s; scrape jobs:\n%s", p.PID(), addr, cfg)
	return &livePrometheus{API: promv1.NewAPI(c), addr: addr, started: started}
}

// podMonitorJobs turns the chart's rendered PodMonitors into scrape jobs the way the Prometheus
// Operator does: the pods of the module namespace its selector matches, the endpoint's scheme,
// path, TLS settings and honorLabels, the platform account's bearer token, and the target
// labels job (the pod's jobLabel label), namespace, pod, container and endpoint.
func podMonitorJobs(t *testing.T, inst *installation, tokenFile string) []map[string]any {
	t.Helper()
	monitors := inst.objs.OfKind("PodMonitor")
	require.Len(t, monitors, 2, "the chart renders a PodMonitor for the controller and one for the agents")
	var pods corev1.PodList
	require.NoError(t, inst.admin.List(t.Context(), &pods, client.InNamespace(bundle.Namespace)))
	var jobs []map[string]any
	for _, pm := range monitors {
		sel, _, err := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
		require.NoError(t, err)
		jobLabel, _, _ := unstructured.NestedString(pm.Object, "spec", "jobLabel")
		namespaces, _, _ := unstructured.NestedStringSlice(pm.Object, "spec", "namespaceSelector", "matchNames")
		require.Equal(t, []string{bundle.Namespace}, namespaces, "%s watches the module namespace", pm.GetName())
		endpoints, _, err := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
		require.NoError(t, err)
		require.Len(t, endpoints, 1, "%s has one endpoint", pm.GetName())
		ep := endpoints[0].(map[string]any)
		authType, _, _ := unstructured.NestedString(ep, "authorization", "type")
		require.Equal(t, "Bearer", authType, "%s scrapes with a bearer token", pm.GetName())
		insecure, _, _ := unstructured.NestedBool(ep, "tlsConfig", "insecureSkipVerify")
		honor, _, _ := unstructured.NestedBool(ep, "honorLabels")
		var configs []map[string]any
		for _, pod := range pods.Items {
			if !labels.SelectorFromSet(sel).Matches(labels.Set(pod.Labels)) {
				continue
			}
			for _, ctr := range pod.Spec.Containers {
				if !slices.ContainsFunc(ctr.Ports, func(p corev1.ContainerPort) bool { return p.Name == ep["port"] }) {
					continue
				}
				r := inst.proc(t, pod.Name, ctr.Name)
				require.NotEmpty(t, r.listen, "%s/%s serves the port %v", pod.Name, ctr.Name, ep["port"])
				configs = append(configs, map[string]any{"targets": []string{r.listen}, "labels": map[string]string{
					"job": pod.Labels[jobLabel], "namespace": pod.Namespace, "pod": pod.Name, "container": ctr.Name,
					"endpoint": fmt.Sprint(ep["port"]),
				}})
			}
		}
		require.NotEmpty(t, configs, "%s selects running pods", pm.GetName())
		jobs = append(jobs, map[string]any{
			"job_name":     "podMonitor/" + pm.GetNamespace() + "/" + pm.GetName() + "/0",
			"scheme":       ep["scheme"],
			"metrics_path": ep["path"],
			"honor_labels": honor,
			"tls_config":   map[string]any{"insecure_skip_verify": insecure},
			"authorization": map[string]any{
				"type": "Bearer", "credentials_file": tokenFile,
			},
			"static_configs": configs,
		})
	}
	return jobs
}

// requireTargets waits until Prometheus has scraped every target once: the PodMonitors' targets
// are up, and the sidecars refused the scrapes without a token (401) and with another account's
// token (403).
func requireTargets(t *testing.T, prom *livePrometheus) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		res, err := prom.Targets(t.Context())
		if !assert.NoError(ct, err) {
			return
		}
		pools := map[string]int{}
		for _, tg := range res.Active {
			pools[tg.ScrapePool]++
			switch {
			case strings.HasPrefix(tg.ScrapePool, "podMonitor/"):
				assert.Equal(ct, promv1.HealthGood, tg.Health, "%s %s: %s", tg.ScrapePool, tg.ScrapeURL, tg.LastError)
			case tg.ScrapePool == "refused/no-token":
				assert.Equal(ct, promv1.HealthBad, tg.Health, "%s %s", tg.ScrapePool, tg.ScrapeURL)
				assert.Contains(ct, tg.LastError, "401 Unauthorized", "%s %s", tg.ScrapePool, tg.ScrapeURL)
			case tg.ScrapePool == "refused/other-account":
				assert.Equal(ct, promv1.HealthBad, tg.Health, "%s %s", tg.ScrapePool, tg.ScrapeURL)
				assert.Contains(ct, tg.LastError, "403 Forbidden", "%s %s", tg.ScrapePool, tg.ScrapeURL)
			}
		}
		assert.Len(ct, pools, 4, "two PodMonitor jobs and two refused ones: %v", pools)
	}, deadline, 250*time.Millisecond)
	// What the programs expose arrives through the sidecars.
	waitQuery(t, prom, `swh_controller_build_info{job="controller", pod="controller-0"}`, true)
	waitQuery(t, prom, `count(swh_agent_build_info{job="agent"}) == 2`, true)
}

// liveRules turns the rule files (Deckhouse's format: a list of groups per file) into one
// Prometheus rule file: the scrape-interval placeholders the chart replaces get the live
// interval, every `for:` becomes forWindow, everything else stays as written.
func liveRules(files map[string][]byte, interval time.Duration, forWindow string) ([]byte, error) {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	secs := int(interval / time.Second)
	placeholders := strings.NewReplacer(
		"__SCRAPE_INTERVAL_X_2__", fmt.Sprintf("%ds", 2*secs), "__SCRAPE_INTERVAL_X_3__", fmt.Sprintf("%ds", 3*secs),
		"__SCRAPE_INTERVAL_X_4__", fmt.Sprintf("%ds", 4*secs), "__SCRAPE_INTERVAL__", fmt.Sprintf("%ds", secs))
	var groups []map[string]any
	for _, n := range names {
		var fileGroups []map[string]any
		if err := yaml.Unmarshal([]byte(placeholders.Replace(string(files[n]))), &fileGroups); err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		for _, g := range fileGroups {
			rules, ok := g["rules"].([]any)
			if !ok {
				return nil, fmt.Errorf("%s: group %v has no rules", n, g["name"])
			}
			for _, r := range rules {
				rule, ok := r.(map[string]any)
				if !ok {
					return nil, fmt.Errorf("%s: a rule of group %v is not a mapping", n, g["name"])
				}
				if _, has := rule["for"]; has {
					rule["for"] = forWindow
				}
			}
			groups = append(groups, g)
		}
	}
	return yaml.Marshal(map[string]any{"groups": groups})
}

// ruleAlerts are the names of every alert of monitoring/prometheus-rules.
func ruleAlerts(t *testing.T) []string {
	t.Helper()
	root, err := bundle.Root()
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(root, "monitoring", "prometheus-rules", "*.yaml"))
	require.NoError(t, err)
	var out []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		var groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
			} `json:"rules"`
		}
		require.NoError(t, yaml.Unmarshal(data, &groups), f)
		for _, g := range groups {
			for _, r := range g.Rules {
				if r.Alert != "" {
					out = append(out, r.Alert)
				}
			}
		}
	}
	require.NotEmpty(t, out)
	return out
}

// waitAlert polls Prometheus' alerts until one named c.alert whose labels include c.labels
// fires (firing true), or until none such is pending or firing.
func waitAlert(t *testing.T, prom *livePrometheus, c alertCase, firing bool) {
	t.Helper()
	start := time.Now()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		res, err := prom.Alerts(t.Context())
		if !assert.NoError(ct, err) {
			return
		}
		var states []string
		for _, a := range res.Alerts {
			if string(a.Labels[model.AlertNameLabel]) != c.alert || !includes(a.Labels, c.labels) {
				continue
			}
			states = append(states, fmt.Sprintf("%s %v", a.State, a.Labels))
			if firing && a.State == promv1.AlertStateFiring {
				return
			}
		}
		if firing {
			assert.Fail(ct, "not firing", "%s %v: %v", c.alert, c.labels, states)
		} else {
			assert.Empty(ct, states, "%s %v resolves", c.alert, c.labels)
		}
	}, alertDeadline, 250*time.Millisecond)
	verb := map[bool]string{true: "fires", false: "resolved"}[firing]
	t.Logf("%s %v %s after %s", c.alert, c.labels, verb, time.Since(start).Round(time.Millisecond))
}

func includes(set, sub model.LabelSet) bool {
	for k, v := range sub {
		if set[k] != v {
			return false
		}
	}
	return true
}

// waitQuery polls an instant query until it returns a series (some true) or none.
func waitQuery(t *testing.T, prom *livePrometheus, q string, some bool) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		v, _, _, err := prom.Query(t.Context(), q, time.Now())
		if !assert.NoError(ct, err, q) {
			return
		}
		vec, ok := v.(model.Vector)
		if !assert.True(ct, ok, "%s: a vector, not %s", q, v.Type()) {
			return
		}
		if some {
			assert.NotEmpty(ct, vec, "%s returns a series", q)
		} else {
			assert.Empty(ct, vec, "%s returns nothing", q)
		}
	}, alertDeadline, 250*time.Millisecond)
}

// tenant is a namespace with pods serving HTTP on 8080 and a resource web selecting them.
type tenant struct {
	inst    *installation
	ns      string
	pods    []*cluster.Pod
	servers []*cluster.Server
	swh     *unstructured.Unstructured
}

// httpHealthcheck probes GET / on 8080 every second.
func httpHealthcheck(failureThreshold int) string {
	return fmt.Sprintf(`
    periodSeconds: 1
    probes:
    - mode: HTTP
      failureThreshold: %d
      http:
        targetPort: 8080
        path: /`, failureThreshold)
}

// lateHealthcheck has six HTTP probes with a two-second timeout every two seconds (a timeout may
// not exceed the period): once the server hangs, each holds a worker for two seconds and the
// agent's two workers cannot start them in time.
var lateHealthcheck = `
    periodSeconds: 2
    probes:` + strings.Repeat(`
    - mode: HTTP
      timeoutSeconds: 2
      failureThreshold: 1
      http:
        targetPort: 8080
        path: /`, 6)

// addTenant makes a namespace with one pod per entry of nodes (on that node) and the resource's
// manifest (not created yet: create).
func addTenant(t *testing.T, inst *installation, name string, nodes []string, healthcheck string) *tenant {
	t.Helper()
	tn := &tenant{inst: inst, ns: inst.c.Env.CreateNamespaceForTest(t, name)}
	for i, node := range nodes {
		p := inst.c.AddPod(t, cluster.PodSpec{Namespace: tn.ns, Name: fmt.Sprintf("web-%d", i), Node: node, Labels: map[string]string{"app": "web"},
			ContainerPorts: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}})
		tn.pods = append(tn.pods, p)
		tn.servers = append(tn.servers, p.ServeHTTP(t, 8080))
	}
	objs, err := stack.DecodeYAML([]byte(`
apiVersion: network.deckhouse.io/v1alpha1
kind: ServiceWithHealthchecks
metadata:
  name: web
  namespace: ` + tn.ns + `
spec:
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: 8080
  healthcheck:` + healthcheck + `
`))
	require.NoError(t, err)
	require.Len(t, objs, 1)
	tn.swh = objs[0]
	return tn
}

func (tn *tenant) create(t *testing.T) {
	t.Helper()
	require.NoError(t, tn.inst.admin.Create(t.Context(), tn.swh), "creating %s/web", tn.ns)
}

// waitReady waits until the resource's status counts n ready endpoints of its port.
func (tn *tenant) waitReady(t *testing.T, n int) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		got := &v1alpha1.ServiceWithHealthchecks{}
		if !assert.NoError(ct, tn.inst.admin.Get(t.Context(), client.ObjectKey{Namespace: tn.ns, Name: "web"}, got)) {
			return
		}
		if assert.Len(ct, got.Status.Ports, 1, "%s/web: status ports", tn.ns) {
			assert.Equal(ct, int32(n), got.Status.Ports[0].ReadyEndpoints, "%s/web: ready endpoints", tn.ns)
		}
	}, deadline, 200*time.Millisecond)
}

// waitWithdrawn waits until every endpoint of the resource on node is withdrawn (not ready,
// not serving).
func (tn *tenant) waitWithdrawn(t *testing.T, node string) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		var list discoveryv1.EndpointSliceList
		if !assert.NoError(ct, tn.inst.admin.List(t.Context(), &list, client.InNamespace(tn.ns), client.MatchingLabels{discoveryv1.LabelServiceName: "web"})) {
			return
		}
		seen := 0
		for _, s := range list.Items {
			for _, e := range s.Endpoints {
				if e.NodeName == nil || *e.NodeName != node {
					continue
				}
				seen++
				assert.False(ct, ptr.Deref(e.Conditions.Ready, true) || ptr.Deref(e.Conditions.Serving, true), "%s: %v on %s is withdrawn", s.Name, e.Addresses, node)
			}
		}
		assert.Positive(ct, seen, "%s/web has endpoints on %s", tn.ns, node)
	}, deadline, 200*time.Millisecond)
}

// moduleWrite is a write of the module an admission policy can refuse.
type moduleWrite struct {
	group, resource string
	ops             []admissionregistrationv1.OperationType
}

var (
	serviceCreate = moduleWrite{"", "services", []admissionregistrationv1.OperationType{admissionregistrationv1.Create}}
	statusUpdate  = moduleWrite{"network.deckhouse.io", "servicewithhealthchecks/status", []admissionregistrationv1.OperationType{admissionregistrationv1.Update}}
	sliceWrite    = moduleWrite{"discovery.k8s.io", "endpointslices", []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}}
)

// refuseModuleWrites makes the API server refuse these writes in namespace ns, as a cluster's
// own admission policy might, waits until the refusal is in force and returns what lifts it
// (and waits until it is lifted). probe is an object of the first write the test may create
// with a dry run to see the refusal.
func refuseModuleWrites(t *testing.T, inst *installation, ns string, probe client.Object, writes ...moduleWrite) func() {
	t.Helper()
	ctx := t.Context()
	name := "swh-test-refuse-" + ns
	var rules []admissionregistrationv1.NamedRuleWithOperations
	for _, w := range writes {
		rules = append(rules, admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: w.ops,
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{w.group}, APIVersions: []string{"*"}, Resources: []string{w.resource}},
		}})
	}
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}},
				ResourceRules:     rules,
			},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "this namespace refuses the module's writes (test fault)"}},
		},
	}
	require.NoError(t, inst.admin.Create(ctx, policy))
	t.Cleanup(func() { _ = client.IgnoreNotFound(inst.admin.Delete(context.Background(), policy)) })
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	require.NoError(t, inst.admin.Create(ctx, binding))
	t.Cleanup(func() { _ = client.IgnoreNotFound(inst.admin.Delete(context.Background(), binding)) })
	probe.SetNamespace(ns)
	probe.SetGenerateName("probe-")
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		err := inst.admin.Create(ctx, probe.DeepCopyObject().(client.Object), client.DryRunAll)
		assert.ErrorContains(ct, err, "refuses the module's writes")
	}, deadline, 200*time.Millisecond, "the refusal is in force")
	return func() {
		t.Helper()
		require.NoError(t, inst.admin.Delete(ctx, binding))
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			assert.NoError(ct, inst.admin.Create(ctx, probe.DeepCopyObject().(client.Object), client.DryRunAll))
		}, deadline, 200*time.Millisecond, "the refusal is lifted")
	}
}

// forgeSlice writes, with node-a's agent credentials (its pod-bound token, under the chart's
// RBAC and admission policies), a slice of tenant tn's resource whose endpoint names tn's pod on
// node-a but an address that is not the pod's: admission admits it, the controller's audit
// deletes it (tests/e2e/traffic/forged_test.go makes the same forgery).
func forgeSlice(t *testing.T, inst *installation, tn *tenant) *discoveryv1.EndpointSlice {
	t.Helper()
	ctx := t.Context()
	agentPod := inst.proc(t, "agent-node-a", "agent")
	agent, err := client.New(restConfigWithToken(t, agentPod.token), client.Options{Scheme: inst.admin.Scheme()})
	require.NoError(t, err)
	honest := tn.pods[0]
	require.Equal(t, "node-a", honest.Node)
	obj, err := honest.Object(ctx)
	require.NoError(t, err)
	swh := &v1alpha1.ServiceWithHealthchecks{}
	require.NoError(t, inst.admin.Get(ctx, client.ObjectKey{Namespace: tn.ns, Name: "web"}, swh))
	key := slicemeta.SliceKey{Resource: swh.Name, Port: "http", Node: "node-a"}
	sliceLabels := key.Labels()
	// Without the node-key label: node-a's honest agent would delete an unknown slice of its own
	// at once; the forger keeps out of its sight and leaves the removal to the audit.
	delete(sliceLabels, wellknown.LabelNodeKey)
	forged := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: tn.ns, Name: forgedChunkName(key), Labels: sliceLabels, Annotations: key.Annotations(),
			OwnerReferences: []metav1.OwnerReference{slicemeta.OwnerReference(swh.Name, swh.UID)},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"198.51.100.7"},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To("node-a"),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: honest.Namespace, Name: honest.Name, UID: obj.UID},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
	require.NoError(t, agent.Create(ctx, forged), "admission admits the forged slice: only the audit can catch it")
	return forged
}

// toolBinary is a binary of a tools group (tools/build.sh builds the group, or waits for a
// build under way).
func toolBinary(t *testing.T, group, name string) string {
	t.Helper()
	root, err := bundle.Root()
	require.NoError(t, err)
	script := filepath.Join(root, "tools", "build.sh")
	build, err := exec.Command("bash", script, group).CombinedOutput()
	require.NoError(t, err, "tools/build.sh %s: %s", group, build)
	out, err := exec.Command("bash", script, "--dir", group).Output()
	require.NoError(t, err)
	dir := strings.TrimSpace(string(out))
	_, err = os.Stat(filepath.Join(dir, ".complete"))
	require.NoError(t, err, "tools group %s is not built (%s)", group, dir)
	return filepath.Join(dir, name)
}

func TestLiveRulesShortenForAndKeepExpressions(t *testing.T) {
	out, err := liveRules(map[string][]byte{
		"b.yaml": []byte(`- name: b
  rules:
  - alert: B
    expr: rate(x[5m]) > 0
    for: 10m
    labels:
      severity_level: "5"
`),
		"a.yaml": []byte(`- name: a
  rules:
  - alert: A
    expr: max_over_time(y[__SCRAPE_INTERVAL_X_2__]) == 1
  - record: r
    expr: sum(y)
`),
	}, time.Second, "2s")
	require.NoError(t, err)
	var got struct {
		Groups []struct {
			Name  string           `json:"name"`
			Rules []map[string]any `json:"rules"`
		} `json:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(out, &got))
	require.Len(t, got.Groups, 2)
	assert.Equal(t, "a", got.Groups[0].Name, "files in name order")
	assert.Equal(t, map[string]any{"alert": "A", "expr": "max_over_time(y[2s]) == 1"}, got.Groups[0].Rules[0], "no for: stays without one")
	assert.Equal(t, map[string]any{"record": "r", "expr": "sum(y)"}, got.Groups[0].Rules[1])
	assert.Equal(t, map[string]any{"alert": "B", "expr": "rate(x[5m]) > 0", "for": "2s", "labels": map[string]any{"severity_level": "5"}},
		got.Groups[1].Rules[0], "for: shortened, the expression verbatim")
	_, err = liveRules(map[string][]byte{"bad.yaml": []byte("- name: x\n")}, time.Second, "2s")
	assert.Error(t, err, "a group without rules")
}

// forgedChunkName is the name a forger of node key.Node gives its slice: a further chunk of the
// node's slice of the port (the agents' admission policy admits only names of the node's own
// slices, issue 40, and the honest agent holds the common name).
func forgedChunkName(key slicemeta.SliceKey) string {
	key.Chunk = 9
	return key.Name()
}
