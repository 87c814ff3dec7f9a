// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package status

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/deckhouse/service-with-healthchecks/api/notready"
	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

// noted is s with the note the agent writes for reasons.
func noted(s discoveryv1.EndpointSlice, reasons map[string]string) discoveryv1.EndpointSlice {
	s.Annotations = map[string]string{notready.Annotation: notready.Encode(reasons)}
	return s
}

func TestPortsListThePodsOutOfEachPortWithTheirReasons(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	r := resource("r", web, smtp)
	got := Ports(r, []discoveryv1.EndpointSlice{
		noted(sl("web", "n1", 8080, podEp("web-1", "10.0.0.2", no), podEp("web-0", "10.0.0.1", yes)),
			map[string]string{"web-1": "probe 0 (HTTP): HTTP status 503"}),
		noted(sl("web", "n2", 8080, podEp("web-3", "10.0.0.4", no), podEp("web-2", "10.0.0.3", no)),
			map[string]string{"web-2": "drained by annotation network.deckhouse.io/drain",
				"web-3": "probe 0 (HTTP): connection refused",
				// A name the slice does not list out is not copied.
				"web-0": "made up", "intruder": "made up"}),
		sl("smtp", "n1", 2525, podEp("web-0", "10.0.0.1", yes), podEp("web-1", "10.0.0.2", yes)),
		// A pod out without a note (a slice written before notes existed) is listed without a reason.
		sl("smtp", "n2", 2525, podEp("web-2", "10.0.0.3", no)),
	})
	assert.Equal(t, []v1alpha1.PortStatus{
		{Name: "web", Port: 80, ReadyEndpoints: 1, TotalEndpoints: 4, NotReady: []v1alpha1.NotReadyPod{
			{Pod: "web-1", Node: "n1", Reason: "probe 0 (HTTP): HTTP status 503"},
			{Pod: "web-2", Node: "n2", Reason: "drained by annotation network.deckhouse.io/drain"},
			{Pod: "web-3", Node: "n2", Reason: "probe 0 (HTTP): connection refused"},
		}},
		{Name: "smtp", Port: 25, ReadyEndpoints: 2, TotalEndpoints: 3, NotReady: []v1alpha1.NotReadyPod{{Pod: "web-2", Node: "n2"}}},
	}, got)
}

func TestPortsListAtMostTenPodsPerPortAndCountTheRest(t *testing.T) {
	no := ptr.To(false)
	var eps []discoveryv1.Endpoint
	reasons := map[string]string{}
	for i := 24; i >= 0; i-- {
		name := fmt.Sprintf("web-%02d", i)
		eps = append(eps, podEp(name, fmt.Sprintf("10.0.0.%d", i+1), no))
		reasons[name] = "probe 0 (TCP): connection refused"
	}
	got := Ports(resource("r", web), []discoveryv1.EndpointSlice{noted(sl("web", "n1", 8080, eps...), reasons)})
	require.Len(t, got, 1)
	require.Len(t, got[0].NotReady, v1alpha1.MaxNotReadyPerPort)
	for i, e := range got[0].NotReady {
		assert.Equal(t, fmt.Sprintf("web-%02d", i), e.Pod, "the first by name")
		assert.Equal(t, "probe 0 (TCP): connection refused", e.Reason)
	}
	assert.Equal(t, int32(15), got[0].NotReadyOmitted)
}

func TestPortsListAtMostAHundredPodsOverAllPorts(t *testing.T) {
	no := ptr.To(false)
	r := resource("r")
	var sls []discoveryv1.EndpointSlice
	for p := range 12 {
		name := fmt.Sprintf("p%02d", p)
		r.Spec.Ports = append(r.Spec.Ports, v1alpha1.ServicePort{Name: name, Port: int32(80 + p)})
		var eps []discoveryv1.Endpoint
		for i := range 10 {
			eps = append(eps, podEp(fmt.Sprintf("pod-%d", i), fmt.Sprintf("10.0.0.%d", i+1), no))
		}
		sls = append(sls, sl(name, "n1", 8080, eps...))
	}
	got := Ports(r, sls)
	listed := 0
	for i, p := range got {
		listed += len(p.NotReady)
		assert.Equal(t, int32(10), p.TotalEndpoints-p.ReadyEndpoints)
		assert.Equal(t, p.TotalEndpoints-p.ReadyEndpoints, int32(len(p.NotReady))+p.NotReadyOmitted, "port %d", i)
	}
	assert.Equal(t, v1alpha1.MaxNotReadyListed, listed)
	assert.Empty(t, got[11].NotReady, "the ports in spec order fill the list")
	assert.Equal(t, int32(10), got[11].NotReadyOmitted)
}

// A slice from a compromised node may carry anything in its note: a huge value, garbage, control
// characters, HTML, invalid UTF-8, names of pods it does not list. None of it breaks the status
// or makes it larger than its bounds.
func TestPortsHostileNotes(t *testing.T) {
	no := ptr.To(false)
	huge := map[string]string{}
	for i := range 5000 {
		huge[fmt.Sprintf("web-%d", i)] = strings.Repeat("x", 1000)
	}
	hugeJSON, err := json.Marshal(huge)
	require.NoError(t, err)
	tests := map[string]struct {
		note   string
		reason string
	}{
		"a note over the bound is ignored": {note: string(hugeJSON)},
		"garbage is ignored":               {note: "{not json"},
		"a JSON array is ignored":          {note: `["web-1"]`},
		"a long reason is cut": {note: `{"web-1":"` + strings.Repeat("é", 5000) + `"}`,
			reason: strings.Repeat("é", (v1alpha1.MaxNotReadyReason-len("…"))/2) + "…"},
		"control characters become spaces, invalid UTF-8 a replacement character": {
			note: "{\"web-1\":\"a\\u0000b\\nc\\u001b[31md \\u003cscript\\u003e\xff\"}", reason: "a b c [31md <script>\uFFFD"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := sl("web", "n1", 8080, podEp("web-1", "10.0.0.2", no))
			s.Annotations = map[string]string{notready.Annotation: tc.note}
			// A targetRef name the API server does not validate.
			long := podEp(strings.Repeat("p", 2000)+"\x00", "10.0.0.3", no)
			s.Endpoints = append(s.Endpoints, long)
			got := Ports(resource("r", web), []discoveryv1.EndpointSlice{s})
			require.Len(t, got, 1)
			require.Len(t, got[0].NotReady, 2)
			assert.Equal(t, "web-1", got[0].NotReady[1].Pod)
			assert.Equal(t, tc.reason, got[0].NotReady[1].Reason)
			assert.LessOrEqual(t, len(got[0].NotReady[0].Pod), 253)
			for _, e := range got[0].NotReady {
				assert.True(t, utf8.ValidString(e.Reason))
				assert.LessOrEqual(t, len(e.Reason), v1alpha1.MaxNotReadyReason)
			}
		})
	}
}

// While the controller withdraws the endpoints of a node whose agent looks stale, their reason
// is the withdrawal; while the liveness guard holds, the agent's note stays.
func TestComputeNamesTheWithdrawalAsTheReason(t *testing.T) {
	no := ptr.To(false)
	r := resource("r", web)
	sls := []discoveryv1.EndpointSlice{noted(sl("web", "n1", 8080, podEp("web-1", "10.0.0.2", no)),
		map[string]string{"web-1": "probe 0 (HTTP): HTTP status 503"})}
	synced := metav1.Condition{Status: metav1.ConditionTrue, Reason: "Synced", Message: "ok"}
	got := Compute(Observed{Resource: r, ServiceSynced: synced, Slices: sls, Service: &corev1.Service{}, Now: metav1.Now(),
		Agents: &Agents{Known: 3, Stale: []string{"n1"}}})
	require.Len(t, got.Ports[0].NotReady, 1)
	assert.Equal(t, "withdrawn by the controller: the agent of node n1 has not renewed its Lease", got.Ports[0].NotReady[0].Reason)
	got = Compute(Observed{Resource: r, ServiceSynced: synced, Slices: sls, Service: &corev1.Service{}, Now: metav1.Now(),
		Agents: &Agents{Known: 3, Stale: []string{"n1"}, Guarded: true}})
	assert.Equal(t, "probe 0 (HTTP): HTTP status 503", got.Ports[0].NotReady[0].Reason)
}
