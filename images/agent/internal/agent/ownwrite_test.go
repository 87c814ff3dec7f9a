// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"testing"

	"github.com/stretchr/testify/assert"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The watch event of a slice write of the agent's own reconciles nothing; every other event of
// the slice does, and each event consumes the record of the write.
func TestOnlyTheEventOfTheAgentsOwnWriteIsSkipped(t *testing.T) {
	slice := func(name, rv string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: rv}}
	}
	tests := map[string]struct {
		written []*discoveryv1.EndpointSlice
		events  []*discoveryv1.EndpointSlice
		want    []bool
		// left is how many records stay after the events.
		left int
	}{
		"the event with the version the write returned is the agent's own": {
			written: []*discoveryv1.EndpointSlice{slice("web-http-node-a", "7")},
			events:  []*discoveryv1.EndpointSlice{slice("web-http-node-a", "7")},
			want:    []bool{true},
		},
		"a later version is someone else's write": {
			written: []*discoveryv1.EndpointSlice{slice("web-http-node-a", "7")},
			events:  []*discoveryv1.EndpointSlice{slice("web-http-node-a", "8")},
			want:    []bool{false},
		},
		"the record is consumed: a second event of the same version (a relist) reconciles": {
			written: []*discoveryv1.EndpointSlice{slice("web-http-node-a", "7")},
			events:  []*discoveryv1.EndpointSlice{slice("web-http-node-a", "7"), slice("web-http-node-a", "7")},
			want:    []bool{true, false},
		},
		"an event that came before the write was recorded consumes nothing it should not": {
			written: []*discoveryv1.EndpointSlice{slice("web-http-node-a", "7")},
			events:  []*discoveryv1.EndpointSlice{slice("web-http-node-a", "6"), slice("web-http-node-a", "7")},
			want:    []bool{false, false},
		},
		"another slice of the same write is its own record": {
			written: []*discoveryv1.EndpointSlice{slice("web-http-node-a", "7"), slice("web-smtp-node-a", "9")},
			events:  []*discoveryv1.EndpointSlice{slice("web-smtp-node-a", "9"), slice("web-http-node-a", "7")},
			want:    []bool{true, true},
		},
		"a write whose event has not come yet stays recorded": {
			written: []*discoveryv1.EndpointSlice{slice("web-http-node-a", "7"), slice("web-smtp-node-a", "9")},
			events:  []*discoveryv1.EndpointSlice{slice("web-http-node-a", "7")},
			want:    []bool{true},
			left:    1,
		},
		"a slice the agent never wrote reconciles": {
			events: []*discoveryv1.EndpointSlice{slice("web-http-node-a", "7")},
			want:   []bool{false},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			w := newOwnWrites()
			written := map[string]*discoveryv1.EndpointSlice{}
			for _, s := range tc.written {
				written[s.Name] = s
			}
			w.note(written)
			var got []bool
			for _, e := range tc.events {
				got = append(got, w.consume(e))
			}
			assert.Equal(t, tc.want, got)
			assert.Len(t, w.rv, tc.left, "no record outlives an event of its slice")
		})
	}
}
