// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package portrule_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/portrule"
)

func TestParseDrain(t *testing.T) {
	cases := map[string]struct {
		value    string
		want     portrule.Drain
		problems []string
	}{
		"a star drains from every resource":        {value: "*", want: portrule.Drain{All: true}},
		"a star with spaces around it":             {value: " * ", want: portrule.Drain{All: true}},
		"a resource":                               {value: "web", want: portrule.Drain{Entries: []portrule.DrainEntry{{Resource: "web"}}}},
		"resources and ports, spaces ignored":      {value: "web/http, db , web/8443", want: portrule.Drain{Entries: []portrule.DrainEntry{{"web", "http"}, {Resource: "db"}, {"web", "8443"}}}},
		"a port number is normalised":              {value: "web/0080", want: portrule.Drain{Entries: []portrule.DrainEntry{{"web", "80"}}}},
		"an empty value is a problem, not a drain": {value: "  ", problems: []string{`the value is empty: write "*" to drain the pod from every resource, or a comma-separated list of resource or resource/port names`}},
		"a star in a list is a problem, the rest applies": {
			value: "web,*", want: portrule.Drain{Entries: []portrule.DrainEntry{{Resource: "web"}}},
			problems: []string{`"*" must stand alone, not in a list`},
		},
		"every bad entry is described, the good ones kept": {
			value: "Web,web/,db/Not_A_Port,db/70000,,ok/metrics",
			want:  portrule.Drain{Entries: []portrule.DrainEntry{{"ok", "metrics"}}},
			problems: []string{
				`"Web": "Web" is not a resource name (a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?'))`,
				`"web/": no port after the slash (write "web" for every port)`,
				`"db/Not_A_Port": "Not_A_Port" is not a port name (must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-))`,
				`"db/70000": must be between 1 and 65535, inclusive`,
				"an empty entry (two commas, or a comma at an end)",
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, problems := portrule.ParseDrain(tc.value)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.problems, problems)
		})
	}
}

func TestParseDrainIsBounded(t *testing.T) {
	value := "a"
	for range 100 {
		value += ",a"
	}
	d, problems := portrule.ParseDrain(value)
	assert.Len(t, d.Entries, 64)
	assert.Equal(t, []string{"more than 64 entries: the rest is ignored"}, problems)
}

func TestDrainCovers(t *testing.T) {
	spec := &v1alpha1.ServiceWithHealthchecksSpec{Ports: []v1alpha1.ServicePort{
		{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)},
		{Port: 8443, TargetPort: intstr.FromInt32(8443)},
	}}
	cases := map[string]struct {
		value string
		res   string
		port  int
		want  bool
	}{
		"a star covers any port of any resource":        {"*", "other", 1, true},
		"a resource covers its every port":              {"web", "web", 1, true},
		"a resource does not cover another":             {"web", "webx", 0, false},
		"a named port by its name":                      {"web/http", "web", 0, true},
		"not the other port":                            {"web/http", "web", 1, false},
		"an unnamed port by its number":                 {"web/8443", "web", 1, true},
		"a named port not by its number":                {"web/80", "web", 0, false},
		"the pod of a resource without ports by name":   {"web", "web", portrule.NoPort, true},
		"no port entry covers a resource without ports": {"web/http", "web", portrule.NoPort, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d, _ := portrule.ParseDrain(tc.value)
			assert.Equal(t, tc.want, d.Covers(tc.res, spec, tc.port))
		})
	}
}

func TestDrainUnknown(t *testing.T) {
	ports := map[string][]v1alpha1.ServicePort{
		"web": {{Name: "http", Port: 80}, {Port: 8443}},
		"db":  nil,
	}
	d, _ := portrule.ParseDrain("web/http,web/8443,db,web/https,cache,db/5432")
	assert.Equal(t, []string{
		`"web/https": ServiceWithHealthchecks "web" has no port "https"`,
		`"cache": no ServiceWithHealthchecks "cache" in the pod's namespace`,
		`"db/5432": ServiceWithHealthchecks "db" has no port "5432"`,
	}, d.Unknown(ports))
}

func TestApplyDrain(t *testing.T) {
	spec := &v1alpha1.ServiceWithHealthchecksSpec{PublishNotReadyAddresses: true, Ports: []v1alpha1.ServicePort{
		{Name: "http", Port: 80}, {Name: "admin", Port: 81},
	}}
	eps := []portrule.Endpoint{
		{PortIndex: 0, Published: true, Ready: true, Serving: true, Decided: true},
		{PortIndex: 1, Published: true, Ready: true, Serving: false, Decided: true},
	}
	d, _ := portrule.ParseDrain("web/admin")
	portrule.ApplyDrain(eps, "web", spec, d)
	assert.Equal(t, portrule.Endpoint{PortIndex: 0, Published: true, Ready: true, Serving: true, Decided: true}, eps[0], "not covered: unchanged")
	assert.Equal(t, portrule.Endpoint{PortIndex: 1, Published: true, Serving: false, Decided: true, Drained: true}, eps[1],
		"covered: not ready, also with publishNotReadyAddresses; serving as probed")
	unpublished := []portrule.Endpoint{{PortIndex: 0}}
	portrule.ApplyDrain(unpublished, "web", spec, portrule.Drain{All: true})
	assert.Equal(t, portrule.Endpoint{PortIndex: 0}, unpublished[0], "an unpublished endpoint stays unpublished")
}
