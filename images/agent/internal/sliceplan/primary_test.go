// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package sliceplan

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestPrimaryNumber(t *testing.T) {
	for _, tc := range []struct {
		name        string
		byNumber    map[int32]int
		published   int32
		isPublished bool
		want        int32
	}{
		{name: "one number", byNumber: map[int32]int{8080: 3}, want: 8080},
		{name: "the most endpoints", byNumber: map[int32]int{8080: 1, 9090: 2}, want: 9090},
		{name: "a tie: the smallest", byNumber: map[int32]int{9090: 2, 8080: 2, 7070: 1}, want: 8080},
		{name: "the published number while in use, though fewer use it", byNumber: map[int32]int{8080: 5, 9090: 1}, published: 9090, isPublished: true, want: 9090},
		{name: "the published number no longer in use", byNumber: map[int32]int{8080: 1, 9090: 2}, published: 7070, isPublished: true, want: 9090},
		{name: "the published number with no endpoint left", byNumber: map[int32]int{8080: 1, 9090: 0}, published: 9090, isPublished: true, want: 8080},
		{name: "nothing published: a zero number is not taken for published", byNumber: map[int32]int{0: 1, 8080: 2}, want: 8080},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, primaryNumber(tc.byNumber, tc.published, tc.isPublished))
		})
	}
}
