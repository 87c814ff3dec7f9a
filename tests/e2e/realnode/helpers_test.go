// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package realnode_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/realnode"
)

// podSpec runs the local server image on the real node: port http (8080) and admin (8081),
// the kubelet's readiness probe GET /ready on admin every second, 5 s of serving after SIGTERM
// (the drain a production pod gets from a preStop hook), the version in an environment
// variable (changing it rolls a Deployment).
func podSpec(version string) corev1.PodSpec {
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	return corev1.PodSpec{
		// No scheduler runs: the pods name their node.
		NodeName:                      nodeName,
		AutomountServiceAccountToken:  new(false),
		TerminationGracePeriodSeconds: new(int64(30)),
		Containers: []corev1.Container{{
			Name: "server", Image: realnode.ServerImage, ImagePullPolicy: corev1.PullNever,
			Args: []string{"-listen", ":8080,:8081", "-term-delay", "5s"},
			Env: []corev1.EnvVar{
				{Name: "POD_NAME", ValueFrom: field("metadata.name")},
				{Name: "POD_NAMESPACE", ValueFrom: field("metadata.namespace")},
				{Name: "VERSION", Value: version},
			},
			Ports: []corev1.ContainerPort{
				{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
				{Name: "admin", ContainerPort: 8081, Protocol: corev1.ProtocolTCP},
			},
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("admin")}},
				PeriodSeconds: 1, FailureThreshold: 1, SuccessThreshold: 1, TimeoutSeconds: 1,
			},
		}},
	}
}

// deployment is the web Deployment: 2 replicas, one surge pod and none unavailable during a
// rollout, a new pod counted available 2 s after it is Ready.
func deployment(ns, version string) *appsv1.Deployment {
	labels := map[string]string{"app": "web"}
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas:        new(int32(2)),
			MinReadySeconds: 2,
			Selector:        &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
				MaxSurge: new(intstr.FromInt32(1)), MaxUnavailable: new(intstr.FromInt32(0)),
			}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       podSpec(version),
			},
		},
	}
}

// waitRunning waits until the pod runs with an IP and returns it.
func waitRunning(t *testing.T, c *cluster.Cluster, pod *corev1.Pod) string {
	t.Helper()
	var ip string
	require.Eventually(t, func() bool {
		var p corev1.Pod
		if err := c.Env.Client.Get(t.Context(), client.ObjectKeyFromObject(pod), &p); err != nil {
			return false
		}
		ip = p.Status.PodIP
		return p.Status.Phase == corev1.PodRunning && ip != ""
	}, tm.WaitFor, tm.Poll, "pod %s did not run", pod.Name)
	return ip
}

// waitPods waits until the namespace's web pods are exactly n Ready pods of version (every
// other pod gone) and returns them sorted by name.
func waitPods(t *testing.T, c *cluster.Cluster, ns, version string, n int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		var list corev1.PodList
		require.NoError(ct, c.Env.Client.List(t.Context(), &list, client.InNamespace(ns), client.MatchingLabels{"app": "web"}))
		pods = list.Items
		require.Len(ct, pods, n)
		for i := range pods {
			assert.Equal(ct, version, envOf(&pods[i], "VERSION"), pods[i].Name)
			assert.True(ct, podReady(&pods[i]) && pods[i].DeletionTimestamp == nil, "%s ready and not terminating", pods[i].Name)
		}
	}, tm.WaitFor, tm.Poll, "%d Ready pods of version %s", n, version)
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return pods
}

func envOf(p *corev1.Pod, name string) string {
	for _, e := range p.Spec.Containers[0].Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// endpoints are the pods' ip:port, sorted.
func endpoints(pods []corev1.Pod, port int) []string {
	var out []string
	for _, p := range pods {
		out = append(out, net.JoinHostPort(p.Status.PodIP, strconv.Itoa(port)))
	}
	slices.Sort(out)
	return out
}

// programmed is where kube-proxy sends new connections of the Service port, sorted.
func programmed(t *testing.T, c *cluster.Cluster, service string, port int32) []string {
	t.Helper()
	got, err := c.ProgrammedEndpoints(t.Context(), service, port)
	require.NoError(t, err)
	slices.Sort(got)
	return got
}

// waitProgrammed waits until kube-proxy sends new connections of the Service port to exactly
// want.
func waitProgrammed(t *testing.T, c *cluster.Cluster, service string, port int32, want []string) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		got, err := c.ProgrammedEndpoints(t.Context(), service, port)
		require.NoError(ct, err)
		slices.Sort(got)
		assert.Equal(ct, want, got)
	}, tm.WaitFor, tm.Poll, "kube-proxy's endpoints of %s:%d", service, port)
}

// control makes the pod's server ready or unready (its /ready answer) through its http port.
func control(t *testing.T, ip, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://%s/control/%s", net.JoinHostPort(ip, "8080"), what), nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// get sends one GET and returns the status and the X-Pod header.
func get(ctx context.Context, url string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("X-Pod"), nil
}
