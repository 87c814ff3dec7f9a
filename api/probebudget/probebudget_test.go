// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package probebudget

import (
	"fmt"
	"reflect"
	"testing"
)

func TestBudgetNoteRoundTrip(t *testing.T) {
	many := make([]Resource, MaxResources+3)
	for i := range many {
		many[i] = Resource{Namespace: "ns", Name: fmt.Sprintf("r%04d", len(many)-i), Asked: 10, Allowed: 1}
	}
	for _, tc := range []struct {
		name      string
		in        Note
		wantEmpty bool
		wantOver  int
		wantMore  int
		wantFirst string
	}{
		{name: "nothing over budget", in: Note{Budget: 5}, wantEmpty: true},
		{name: "one", in: Note{Budget: 5, Over: []Resource{{Namespace: "a", Name: "x", Asked: 9, Allowed: 5}}}, wantOver: 1, wantFirst: "x"},
		{name: "bounded, in name order", in: Note{Budget: 5, Over: many}, wantOver: MaxResources, wantMore: 3, wantFirst: "r0001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Encode(tc.in)
			if (v == "") != tc.wantEmpty {
				t.Fatalf("Encode = %q, want empty %v", v, tc.wantEmpty)
			}
			got, err := Parse(v)
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Over) != tc.wantOver || got.More != tc.wantMore {
				t.Fatalf("Parse(Encode) = %d named, %d more; want %d, %d", len(got.Over), got.More, tc.wantOver, tc.wantMore)
			}
			if tc.wantOver > 0 && got.Over[0].Name != tc.wantFirst {
				t.Fatalf("first = %q, want %q", got.Over[0].Name, tc.wantFirst)
			}
			if tc.wantOver == 1 && !reflect.DeepEqual(got.Over, tc.in.Over) {
				t.Fatalf("Over = %+v, want %+v", got.Over, tc.in.Over)
			}
		})
	}
	if _, err := Parse("{not json"); err == nil {
		t.Fatal("Parse accepted a malformed value")
	}
}
