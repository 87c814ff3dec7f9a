// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package realnode_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/realnode"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/e2e"
)

// TestRealNodeImagesAreReproducible: building the local images twice from the same source gives
// archives with the same bytes (the same digests in containerd).
func TestRealNodeImagesAreReproducible(t *testing.T) {
	realnode.SkipUnlessEnabled(t)
	digests := func() map[string]string {
		archives, err := realnode.BuildImages(t.TempDir())
		require.NoError(t, err)
		out := map[string]string{}
		for _, a := range archives {
			data, err := os.ReadFile(a)
			require.NoError(t, err)
			sum := sha256.Sum256(data)
			out[filepath.Base(a)] = hex.EncodeToString(sum[:])
		}
		return out
	}
	first, second := digests(), digests()
	require.Len(t, first, 3, "pause, podserver, testserver")
	require.Equal(t, first, second)
}

// controlPort is the test server's control listener in testServerPod.
const controlPort = 9999

// testServerPod is a pod of the multi-mode test server image on the real node: one listener
// per MODE=ADDR of listeners, each a named container port, and the control listener.
func testServerPod(ns, name string, ports []corev1.ContainerPort, listeners ...string) *corev1.Pod {
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		NodeName:                      nodeName,
		AutomountServiceAccountToken:  new(false),
		TerminationGracePeriodSeconds: new(int64(1)),
		Containers: []corev1.Container{{
			Name: "server", Image: realnode.TestServerImage, ImagePullPolicy: corev1.PullNever,
			Args: append([]string{fmt.Sprintf("-control=:%d", controlPort)}, listeners...),
			Env: []corev1.EnvVar{
				{Name: "POD_NAME", ValueFrom: field("metadata.name")},
				{Name: "POD_NAMESPACE", ValueFrom: field("metadata.namespace")},
			},
			Ports: ports,
		}},
	}}
	pod.Namespace, pod.Name, pod.Labels = ns, name, map[string]string{"app": name}
	return pod
}

// postControl sends a control request to the test server of the pod at ip.
func postControl(t *testing.T, ip, path string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	url := fmt.Sprintf("http://%s%s", net.JoinHostPort(ip, fmt.Sprint(controlPort)), path)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", path, body)
}

// waitNotReadyEvent waits for the agent's PortNotReady Event of the pod's port whose note has
// reason, and returns the note.
func waitNotReadyEvent(t *testing.T, c *cluster.Cluster, ns, pod, port, reason string) string {
	t.Helper()
	prefix := "pod " + pod + ", port " + port + ": "
	var note string
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		var list eventsv1.EventList
		require.NoError(ct, c.Env.Client.List(t.Context(), &list, client.InNamespace(ns)))
		for _, e := range list.Items {
			if e.Reason == "PortNotReady" && strings.HasPrefix(e.Note, prefix) && strings.Contains(e.Note, reason) {
				note = e.Note
				return
			}
		}
		assert.Fail(ct, "no PortNotReady event", "%s...%s", prefix, reason)
	}, tm.WaitFor, tm.Poll)
	return note
}

// waitUnprogrammed waits until kube-proxy sends no new connection of the Service port anywhere.
func waitUnprogrammed(t *testing.T, c *cluster.Cluster, service string, port int32) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		got, err := c.ProgrammedEndpoints(t.Context(), service, port)
		require.NoError(ct, err)
		assert.Empty(ct, got)
	}, tm.WaitFor, tm.Poll, "kube-proxy's endpoints of %s:%d", service, port)
}

// TestRealNodeHostileAndGRPCPortsBesideAServingPort: one container of the local test server
// image on the real node serves HTTP (port http), a header line that never ends (port
// hostile), a server that accepts and never greets (port silent), a 1 TiB body (port bigbody)
// and the gRPC health service (port grpc). The agent's probes of hostile and silent fail with
// clear reasons (the prober's bound; the banner check's deadline) and those ports are never
// published; bigbody is published (the prober judges the status and reads a bounded part of the
// body); the gRPC port follows the health service's status as the test flips it through the
// server's control listener; and the HTTP port keeps its endpoint throughout: 0 failed requests
// through it.
func TestRealNodeHostileAndGRPCPortsBesideAServingPort(t *testing.T) {
	s, _ := realStack(t)
	c := s.Cluster
	ns := c.Env.CreateNamespaceForTest(t, "hostile")
	pod := testServerPod(ns, "mixed", []corev1.ContainerPort{
		{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
		{Name: "hostile", ContainerPort: 8082, Protocol: corev1.ProtocolTCP},
		{Name: "grpc", ContainerPort: 9090, Protocol: corev1.ProtocolTCP},
		{Name: "silent", ContainerPort: 2526, Protocol: corev1.ProtocolTCP},
		{Name: "bigbody", ContainerPort: 8083, Protocol: corev1.ProtocolTCP},
	}, "http=:8080", "endless-headers=:8082", "grpc-health=:9090", "silent=:2526", "huge-body=:8083")
	require.NoError(t, c.Env.Client.Create(t.Context(), pod))
	ip := waitRunning(t, c, pod)
	grpcProbe := v1alpha1.Probe{
		Mode: v1alpha1.ProbeModeGRPC, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: tm.FailureThreshold,
		GRPC: &v1alpha1.GRPCProbe{TargetPort: intstr.FromString("grpc")},
	}
	bannerProbe := tm.TCPProbe(intstr.FromString("silent"))
	bannerProbe.TCP.Steps = []v1alpha1.TCPStep{{Expect: &v1alpha1.TCPExpect{Prefix: "220"}}}
	res := tm.Resource(ns, "mixed", map[string]string{"app": "mixed"},
		[]v1alpha1.ServicePort{
			e2e.ServicePort("web", 80, intstr.FromString("http")),
			e2e.ServicePort("hostile", 82, intstr.FromString("hostile")),
			e2e.ServicePort("grpc", 90, intstr.FromString("grpc")),
			e2e.ServicePort("silent", 26, intstr.FromString("silent")),
			e2e.ServicePort("bigbody", 83, intstr.FromString("bigbody")),
		},
		tm.HTTPProbe(intstr.FromString("http")), tm.HTTPProbe(intstr.FromString("hostile")), grpcProbe,
		bannerProbe, tm.HTTPProbe(intstr.FromString("bigbody")))
	require.NoError(t, s.Apply(t.Context(), ns, res))
	svc := ns + "/mixed"
	waitProgrammed(t, c, svc, 80, []string{net.JoinHostPort(ip, "8080")})
	waitProgrammed(t, c, svc, 90, []string{net.JoinHostPort(ip, "9090")})
	waitProgrammed(t, c, svc, 83, []string{net.JoinHostPort(ip, "8083")})
	note := waitNotReadyEvent(t, c, ns, "mixed", "hostile", "response status line and headers exceed 64 KiB (the prober's limit)")
	t.Logf("hostile port: %s", note)
	note = waitNotReadyEvent(t, c, ns, "mixed", "silent", `timeout after 1s: expected a reply starting with "220", got nothing`)
	t.Logf("silent port: %s", note)
	require.Empty(t, programmed(t, c, svc, 82), "the hostile port is not published")
	require.Empty(t, programmed(t, c, svc, 26), "the silent port is not published")

	loop := c.Traffic(t, cluster.TrafficOptions{Service: svc, Port: 80, Duration: 5 * time.Minute})
	tm.WaitRequestsAfter(t, loop, time.Now(), tm.MinInWindow)
	from := time.Now()
	postControl(t, ip, "/grpc/status/NOT_SERVING")
	waitUnprogrammed(t, c, svc, 90)
	t.Logf("grpc port: %s", waitNotReadyEvent(t, c, ns, "mixed", "grpc", "gRPC NOT_SERVING"))
	require.Equal(t, []string{net.JoinHostPort(ip, "8080")}, programmed(t, c, svc, 80), "the HTTP port keeps the pod")
	postControl(t, ip, "/grpc/status/SERVING")
	waitProgrammed(t, c, svc, 90, []string{net.JoinHostPort(ip, "9090")})
	to := time.Now()
	tm.WaitRequestsAfter(t, loop, to, tm.MinInWindow)
	results := loop.Stop()

	in := tm.RequireWindow(t, results, "gRPC flip beside a hostile port", from, to)
	require.Empty(t, results.Failed(), "failed requests: %s", e2e.Failures(results))
	assert.Equal(t, []string{ns + "/mixed"}, in.Pods(), "the pod kept serving the HTTP port")
	require.Empty(t, programmed(t, c, svc, 82), "the hostile port stayed unpublished")
	require.Empty(t, programmed(t, c, svc, 26), "the silent port stayed unpublished")
}
