// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package installed

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/process"
	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/platform"
)

// The platform's monitoring accounts: Prometheus, which the chart lets scrape, and another one.
const (
	prometheusAccount = "prometheus"
	otherAccount      = "grafana"
)

// deadline bounds every wait of the test.
const deadline = 2 * time.Minute

// running is one rendered container running as a process.
type running struct {
	pod, container string
	listen         string // kube-rbac-proxy: where it listens
	token          string // the pod's bound token

	proc  *process.Process // the current run
	start func()           // starts the container again after Stop, and waits until it is ready
}

// Stop stops the container's process (SIGTERM, as the kubelet does) and waits for its exit.
func (r *running) Stop(t *testing.T) {
	t.Helper()
	require.NoError(t, r.proc.Stop(), "stopping %s/%s", r.pod, r.container)
}

// Start starts the stopped container again, as the kubelet restarts a container, and waits
// until it is ready.
func (r *running) Start(t *testing.T) {
	t.Helper()
	require.True(t, r.proc.Exited(), "%s/%s is stopped first", r.pod, r.container)
	r.start()
}

func TestTheChartRunsAsInstalled(t *testing.T) {
	inst := install(t, documentedModuleConfig(t))
	c, admin, kube, procs := inst.c, inst.admin, inst.kube, inst.procs
	ctx := t.Context()

	// 5. Each program acts as its own ServiceAccount, bound to its pod's node.
	for _, p := range procs {
		if p.container == "kube-rbac-proxy" {
			continue
		}
		who := whoAmI(t, p.token)
		wantSA := map[string]string{"controller": "controller", "agent": "agent"}[p.container]
		assert.Equal(t, controlplane.ServiceAccountUser(bundle.Namespace, wantSA), who.Username, "%s runs as its ServiceAccount", p.pod)
		assert.NotContains(t, who.Groups, "system:masters", "%s is not the administrator", p.pod)
		assert.Equal(t, []string{p.pod}, []string(who.Extra["authentication.kubernetes.io/pod-name"]), "%s's token is bound to its pod", p.pod)
		assert.Len(t, who.Extra["authentication.kubernetes.io/node-name"], 1, "%s's token names its node", p.pod)
	}

	// 6. A tenant's resource gets its child Service and one slice per node, all written by the
	// programs under their own RBAC and the chart's policies.
	ns := c.Env.CreateNamespaceForTest(t, "tenant")
	var pods []*cluster.Pod
	for _, n := range c.Nodes {
		p := c.AddPod(t, cluster.PodSpec{Namespace: ns, Name: "web-" + n.Name, Node: n.Name, Labels: map[string]string{"app": "web"},
			ContainerPorts: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}})
		p.ServeHTTP(t, 8080)
		pods = append(pods, p)
	}
	// The tenant's manifest as a user writes it (the API server fills in the defaults).
	manifest, err := stack.DecodeYAML([]byte(`
apiVersion: network.deckhouse.io/v1alpha1
kind: ServiceWithHealthchecks
metadata:
  name: web
  namespace: ` + ns + `
spec:
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: 8080
  healthcheck:
    periodSeconds: 1
    initialDelaySeconds: 0
    probes:
    - mode: HTTP
      http:
        targetPort: 8080
        path: /
`))
	require.NoError(t, err)
	require.Len(t, manifest, 1)
	require.NoError(t, admin.Create(ctx, manifest[0]))
	swh := &v1alpha1.ServiceWithHealthchecks{}
	require.NoError(t, admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web"}, swh))
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		svc := &corev1.Service{}
		if !assert.NoError(ct, admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web"}, svc), "the controller creates the child Service") {
			return
		}
		owner := metav1.GetControllerOf(svc)
		assert.True(ct, owner != nil && owner.UID == swh.UID, "the child Service is owned by the resource")
		var slices discoveryv1.EndpointSliceList
		assert.NoError(ct, admin.List(ctx, &slices, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: "web"}))
		ready := map[string]string{}
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready && e.NodeName != nil {
					ready[*e.NodeName] = e.Addresses[0]
				}
			}
		}
		want := map[string]string{}
		for _, p := range pods {
			want[p.Node] = p.IP.String()
		}
		assert.Equal(ct, want, ready, "each node's agent publishes its pod, probed ready")
		got := &v1alpha1.ServiceWithHealthchecks{}
		if assert.NoError(ct, admin.Get(ctx, client.ObjectKeyFromObject(swh), got)) {
			assert.True(ct, metaConditionTrue(got.Status.Conditions, "Ready"), "the controller writes the resource's status: %+v", got.Status.Conditions)
		}
	}, deadline, 200*time.Millisecond)

	// 7. Each sidecar serves its program's metrics to Prometheus only.
	promToken := accountToken(t, kube, prometheusAccount)
	otherToken := accountToken(t, kube, otherAccount)
	for _, p := range procs {
		if p.container != "kube-rbac-proxy" {
			continue
		}
		program := strings.SplitN(p.pod, "-", 2)[0]
		t.Run("the sidecar of "+p.pod, func(t *testing.T) {
			require.EventuallyWithT(t, func(ct *assert.CollectT) {
				status, body, err := scrape(p.listen, promToken)
				if !assert.NoError(ct, err) {
					return
				}
				assert.Equal(ct, http.StatusOK, status, "Prometheus's token is allowed: %s", body)
				assert.Contains(ct, body, "swh_"+program+"_", "the body is the %s's metrics", program)
			}, deadline, 200*time.Millisecond)
			status, body, err := scrape(p.listen, otherToken)
			require.NoError(t, err)
			assert.Equal(t, http.StatusForbidden, status, "another account is refused: %s", body)
			status, body, err = scrape(p.listen, "")
			require.NoError(t, err)
			assert.Equal(t, http.StatusUnauthorized, status, "no token is refused: %s", body)
		})
	}
}

// installation is the chart installed and running: the cluster, the administrator's clients,
// the rendered objects and the running containers.
type installation struct {
	c     *cluster.Cluster
	admin client.Client
	kube  kubernetes.Interface
	objs  bundle.Objects
	procs []*running
}

// proc is the running container of a pod.
func (in *installation) proc(t *testing.T, pod, container string) *running {
	t.Helper()
	for _, p := range in.procs {
		if p.pod == pod && p.container == container {
			return p
		}
	}
	t.Fatalf("no container %s/%s", pod, container)
	return nil
}

// install starts a cluster of two nodes and installs the chart in it with the ModuleConfig mc
// (steps 1 to 4 of TestTheChartRunsAsInstalled).
func install(t *testing.T, mc platform.ModuleConfig) *installation {
	t.Helper()
	crds, err := bundle.PlatformCRDPaths()
	require.NoError(t, err)
	c := cluster.Start(t, cluster.Options{
		Nodes: []cluster.Node{
			// node-a carries the label the documented ModuleConfig places the controller by.
			{Name: "node-a", Zone: "zone-a", Labels: map[string]string{"node-role.example.com/infra": ""}},
			{Name: "node-b", Zone: "zone-b"},
		},
		ControlPlane: controlplane.Options{ExtraCRDPaths: crds},
	})
	ctx := t.Context()
	admin := c.Env.Client
	apiServer.host, apiServer.ca = c.Env.Config.Host, c.Env.Config.CAData
	kube, err := kubernetes.NewForConfig(c.Env.Config)
	require.NoError(t, err)
	proxyBin := kubeRBACProxy(t)
	bins, err := stack.Build()
	require.NoError(t, err)
	binaries := map[string]string{"controller": bins.Controller, "agent": bins.Agent, "kube-rbac-proxy": proxyBin}

	// 1. The ModuleConfig, through the settings schema and the hooks, to values, and the chart
	// rendered with them as Deckhouse passes an embedded module.
	values, renderCtx, err := platform.Values(t, mc, bundle.ValueSet{EnabledModules: bundle.AllPlatformModules}, platform.Cluster{})
	require.NoError(t, err)
	rendered, err := bundle.RenderContext(values, renderCtx)
	require.NoError(t, err)
	objs := bundle.Objects(rendered)

	// 2. What the platform has before the module: its monitoring namespace and accounts.
	createNamespace(t, admin, bundle.MonitoringNamespace)
	for _, sa := range []string{prometheusAccount, otherAccount} {
		require.NoError(t, admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: bundle.MonitoringNamespace, Name: sa}}))
	}

	// 3. Every rendered object, applied the way the platform's Helm does (as its administrator,
	// in Helm's install order), and every admission policy in force before anything runs.
	applyAll(t, admin, objs)
	waitPoliciesChecked(t, admin, objs)

	// 4. The pods the Deployment and the DaemonSet would get, bound to nodes, with their status,
	// and the processes of their containers.
	deploy, err := objs.Deployment(bundle.Namespace, "controller")
	require.NoError(t, err)
	ds, err := objs.DaemonSet(bundle.Namespace, "agent")
	require.NoError(t, err)
	var procs []*running
	ctrlNode := nodeFor(t, c, deploy.Spec.Template.Spec.NodeSelector)
	procs = append(procs, startPod(t, c, kube, binaries, "controller-0", deploy.Spec.Template, ctrlNode, false)...)
	for _, n := range c.Nodes {
		procs = append(procs, startPod(t, c, kube, binaries, "agent-"+n.Name, ds.Spec.Template, n, true)...)
	}
	return &installation{c: c, admin: admin, kube: kube, objs: objs, procs: procs}
}

// documentedModuleConfig is the ModuleConfig of docs/CONFIGURATION.md that sets every setting.
func documentedModuleConfig(t *testing.T) platform.ModuleConfig {
	t.Helper()
	root, err := bundle.Root()
	require.NoError(t, err)
	md, err := os.ReadFile(filepath.Join(root, "docs", "CONFIGURATION.md"))
	require.NoError(t, err)
	mcs, err := platform.ModuleConfigsIn(md)
	require.NoError(t, err)
	require.Len(t, mcs, 2)
	return mcs[1]
}

// kubeRBACProxy is the kube-rbac-proxy binary of the tools group of that name. make test builds
// it beside the first tests (hack/test.sh): tools/build.sh waits for that build, or builds the
// group itself when the package runs alone.
func kubeRBACProxy(t *testing.T) string {
	t.Helper()
	return toolBinary(t, "kube-rbac-proxy", "kube-rbac-proxy")
}

func createNamespace(t *testing.T, c client.Client, name string) {
	t.Helper()
	require.NoError(t, client.IgnoreAlreadyExists(c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})))
}

// installOrder is Helm's install order of the kinds the chart may render; other kinds follow,
// in file order.
var installOrder = []string{
	"Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodDisruptionBudget", "ServiceAccount",
	"Secret", "ConfigMap", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Role",
	"RoleBinding", "Service", "DaemonSet", "Pod", "Deployment", "StatefulSet", "Job",
}

// applyAll server-side applies every object, as the platform's administrator, in install order.
func applyAll(t *testing.T, c client.Client, objs bundle.Objects) {
	t.Helper()
	rank := func(kind string) int {
		if i := slices.Index(installOrder, kind); i >= 0 {
			return i
		}
		return len(installOrder)
	}
	ordered := slices.Clone(objs)
	slices.SortStableFunc(ordered, func(a, b *unstructured.Unstructured) int { return rank(a.GetKind()) - rank(b.GetKind()) })
	kinds := map[string]int{}
	for _, obj := range ordered {
		u := obj.DeepCopy()
		require.NoError(t, c.Apply(t.Context(), client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("helm"), client.ForceOwnership),
			"applying %s %s/%s", u.GetKind(), u.GetNamespace(), u.GetName())
		kinds[u.GetKind()]++
	}
	for _, kind := range []string{"Namespace", "ServiceAccount", "ClusterRole", "Role", "Deployment", "DaemonSet", "PodDisruptionBudget", "ValidatingAdmissionPolicy", "PodMonitor", "VerticalPodAutoscaler", "PrometheusRule"} {
		assert.Positive(t, kinds[kind], "the chart rendered and the API server stored a %s", kind)
	}
	assert.Len(t, ordered, len(objs), "every rendered object was applied")
}

// waitPoliciesChecked waits until the admission policies applied with the chart are in force
// before the programs start: the API server learns policies through an informer, so it polls
// until the chart's credential-Secret policy refuses a malformed Secret. The policies were
// applied before that probe, in one batch, and the same informer serves them all. (envtest runs
// no kube-controller-manager, so the policies' status.typeChecking is never written here.)
func waitPoliciesChecked(t *testing.T, c client.Client, objs bundle.Objects) {
	t.Helper()
	require.NotEmpty(t, objs.OfKind("ValidatingAdmissionPolicy"))
	require.Len(t, objs.OfKind("ValidatingAdmissionPolicyBinding"), len(objs.OfKind("ValidatingAdmissionPolicy")), "every policy is bound")
	// The credential-Secret policy is enforced: a malformed credential Secret is refused. (The
	// API server learns a checked policy through an informer: poll until it refuses.)
	bad := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: bundle.Namespace, GenerateName: "malformed-"},
		Type:       "network.deckhouse.io/postgresql-credentials",
		Data:       map[string][]byte{"password": []byte("no user")},
	}
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		err := c.Create(t.Context(), bad.DeepCopy(), client.DryRunAll)
		assert.ErrorContains(ct, err, `needs a non-empty key "user"`)
	}, deadline, 200*time.Millisecond)
}

// nodeFor is a node whose labels satisfy the pod's node selector.
func nodeFor(t *testing.T, c *cluster.Cluster, selector map[string]string) cluster.NodeInfo {
	t.Helper()
	for _, n := range c.Nodes {
		nodeLabels := map[string]string{corev1.LabelHostname: n.Name}
		for k, v := range n.Labels {
			nodeLabels[k] = v
		}
		if labels.SelectorFromSet(selector).Matches(labels.Set(nodeLabels)) {
			return n
		}
	}
	t.Fatalf("no node matches the node selector %v", selector)
	return cluster.NodeInfo{}
}

// startPod creates the Pod of a rendered template on a node, as the workload controller and the
// scheduler would, writes the status the kubelet would (the simulated pod shares its node's host
// network, so its IP is the node's), and starts each container as a process.
func startPod(t *testing.T, c *cluster.Cluster, kube kubernetes.Interface, binaries map[string]string,
	name string, tmpl corev1.PodTemplateSpec, node cluster.NodeInfo, agent bool) []*running {
	t.Helper()
	ctx := t.Context()
	pod := &corev1.Pod{ObjectMeta: *tmpl.ObjectMeta.DeepCopy(), Spec: *tmpl.Spec.DeepCopy()}
	pod.Namespace, pod.Name = bundle.Namespace, name
	pod.Spec.NodeName = node.Name
	require.NoError(t, c.Env.Client.Create(ctx, pod), "creating pod %s", name)
	ip := node.IP.String()
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, HostIP: ip, HostIPs: []corev1.HostIP{{IP: ip}}, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		StartTime: new(metav1.Now()),
	}
	require.NoError(t, c.Env.Client.Status().Update(ctx, pod))

	// The token the kubelet would project: TokenRequest for the pod's account, bound to the pod.
	tr, err := kube.CoreV1().ServiceAccounts(bundle.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: new(int64(3600)),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err, "a token bound to %s", name)
	saDir := t.TempDir()
	for file, data := range map[string][]byte{"token": []byte(tr.Status.Token), "ca.crt": c.Env.Config.CAData, "namespace": []byte(bundle.Namespace)} {
		require.NoError(t, os.WriteFile(filepath.Join(saDir, file), data, 0o600))
	}

	var out []*running
	var upstreamOverride string
	for i := range pod.Spec.Containers {
		ctr := &pod.Spec.Containers[i]
		bin, ok := binaries[ctr.Name]
		require.True(t, ok, "container %s of %s has a program here", ctr.Name, name)
		env, order, err := resolveEnv(pod, ctr)
		require.NoError(t, err)
		args := make([]string, 0, len(ctr.Args))
		for _, a := range ctr.Args {
			args = append(args, expand(a, env))
		}
		r := &running{pod: name, container: ctr.Name, token: tr.Status.Token}
		probePorts := map[string]string{}
		switch {
		case ctr.Name == "kube-rbac-proxy":
			tr, err := translateProxy(args, env, t.TempDir(), upstreamOverride)
			require.NoError(t, err)
			t.Logf("%s/kube-rbac-proxy: upstream flags %v; left out (Deckhouse's build only): %v", name, tr.args, tr.dropped)
			args = tr.args
			listen, _ := bundle.Flag(&corev1.Container{Args: args}, "secure-listen-address")
			r.listen = listen
		case agent:
			// The simulated nodes share one network namespace: the agents' loopback ports would
			// collide, so each agent's metrics and health addresses move to free loopback ports.
			args, upstreamOverride, probePorts = overrideAgentPorts(t, name, args)
		}
		r.start = func() {
			r.proc = startInCluster(t, name+"/"+ctr.Name, bin, args, env, order, saDir, c.Env.Config.Host)
			waitReady(t, pod, ctr, r, probePorts)
		}
		r.start()
		out = append(out, r)
	}
	return out
}

// overrideAgentPorts moves an agent's metrics and health bind addresses to free loopback ports
// and returns the new arguments, the new metrics address (the sidecar's upstream) and the
// rendered-to-new port mapping for the readiness probe.
func overrideAgentPorts(t *testing.T, pod string, args []string) ([]string, string, map[string]string) {
	t.Helper()
	out := slices.Clone(args)
	ports := map[string]string{}
	var metrics string
	for i, a := range out {
		for _, flag := range []string{"metrics-bind-address", "health-probe-bind-address"} {
			old, ok := strings.CutPrefix(a, "--"+flag+"=")
			if !ok {
				continue
			}
			addr := freeLoopback(t)
			out[i] = "--" + flag + "=" + addr
			_, oldPort, err := net.SplitHostPort(old)
			require.NoError(t, err)
			_, newPort, _ := net.SplitHostPort(addr)
			ports[oldPort] = newPort
			if flag == "metrics-bind-address" {
				metrics = addr
			}
			t.Logf("%s: --%s %s overridden to %s (simulated nodes share one network namespace)", pod, flag, old, addr)
		}
	}
	require.NotEmpty(t, metrics, "the agent renders a metrics address")
	return out, metrics, ports
}

func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// inClusterScript gives the program the files an in-cluster client reads, in a mount namespace
// of its own (the process starts in it): /var/run/secrets/kubernetes.io/serviceaccount, on a
// tmpfs over /run that only this process sees.
const inClusterScript = `set -e
dir=$1
shift
/usr/bin/mount -t tmpfs -o mode=0755,size=1m swh-serviceaccount /run
/usr/bin/mkdir -p /run/secrets/kubernetes.io/serviceaccount
/usr/bin/cp "$dir/token" "$dir/ca.crt" "$dir/namespace" /run/secrets/kubernetes.io/serviceaccount/
exec "$@"`

// startInCluster starts a program with exactly the container's environment plus the variables
// the kubelet adds for in-cluster clients, and its pod's service-account files.
func startInCluster(t *testing.T, name, bin string, args []string, env map[string]string, order []string, saDir, apiServer string) *process.Process {
	t.Helper()
	u, err := url.Parse(apiServer)
	require.NoError(t, err)
	host, port, err := net.SplitHostPort(u.Host)
	require.NoError(t, err)
	environ := make([]string, 0, len(order)+2)
	for _, k := range order {
		environ = append(environ, k+"="+env[k])
	}
	environ = append(environ, "KUBERNETES_SERVICE_HOST="+host, "KUBERNETES_SERVICE_PORT="+port)
	cmd := exec.Command("/bin/sh", append([]string{"-c", inClusterScript, "swh-in-cluster", saDir, bin}, args...)...)
	cmd.Env = environ
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	return process.StartForTest(t, name, cmd)
}

// waitReady waits until the container is ready the way the kubelet would see it: its rendered
// readiness probe for the programs; a TLS handshake on its listen address for kube-rbac-proxy,
// whose rendered probe path exists only in Deckhouse's build.
func waitReady(t *testing.T, pod *corev1.Pod, c *corev1.Container, r *running, probePorts map[string]string) {
	t.Helper()
	if r.listen != "" {
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			conn, err := tls.Dial("tcp", r.listen, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // its certificate is self-signed
			if assert.NoError(ct, err, "%s/%s listens on %s", r.pod, r.container, r.listen) {
				_ = conn.Close()
			}
		}, deadline, 100*time.Millisecond)
		return
	}
	probe := c.ReadinessProbe
	require.NotNil(t, probe, "%s renders a readiness probe", c.Name)
	require.NotNil(t, probe.HTTPGet)
	port := probe.HTTPGet.Port.String()
	if probe.HTTPGet.Port.Type == intstr.String {
		for _, p := range c.Ports {
			if p.Name == port {
				port = strconv.Itoa(int(p.ContainerPort))
			}
		}
	}
	if moved, ok := probePorts[port]; ok {
		port = moved
	}
	host := probe.HTTPGet.Host
	if host == "" {
		host = pod.Status.PodIP
	}
	target := "http://" + net.JoinHostPort(host, port) + probe.HTTPGet.Path
	hc := &http.Client{Timeout: time.Second}
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		resp, err := hc.Get(target)
		if !assert.NoError(ct, err, "%s/%s readiness %s", r.pod, r.container, target) {
			return
		}
		_ = resp.Body.Close()
		assert.Equal(ct, http.StatusOK, resp.StatusCode, "%s/%s readiness %s", r.pod, r.container, target)
	}, deadline, 100*time.Millisecond)
}

// whoAmI asks the API server who a token is (SelfSubjectReview, with the token itself).
func whoAmI(t *testing.T, token string) authenticationv1.UserInfo {
	t.Helper()
	cfg := restConfigWithToken(t, token)
	kube, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	review, err := kube.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	require.NoError(t, err)
	return review.Status.UserInfo
}

// accountToken is a token of a platform account (from TokenRequest, not bound to a pod).
func accountToken(t *testing.T, kube kubernetes.Interface, sa string) string {
	t.Helper()
	tr, err := kube.CoreV1().ServiceAccounts(bundle.MonitoringNamespace).CreateToken(t.Context(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return tr.Status.Token
}

// scrape GETs /metrics from a sidecar the way Prometheus does (TLS without verification, as the
// chart's PodMonitors say), with a bearer token when given.
func scrape(listen, token string) (int, string, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "https://"+listen+"/metrics", nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the sidecar's certificate is self-signed
	}}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("scraping %s: %w", listen, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(body), err
}

func metaConditionTrue(conds []metav1.Condition, typ string) bool {
	for _, c := range conds {
		if c.Type == typ {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

// apiServer is the API server address and CA the test's clients of a token use.
var apiServer struct {
	host string
	ca   []byte
}

// restConfigWithToken is a client configuration with only the token: no client certificate, no
// impersonation, what an in-cluster client has.
func restConfigWithToken(t *testing.T, token string) *rest.Config {
	t.Helper()
	require.NotEmpty(t, apiServer.host, "the test records the API server first")
	return &rest.Config{Host: apiServer.host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: apiServer.ca}}
}
