// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/deckhouse/service-with-healthchecks/lib/eventnote"
)

// The actions of ProbesLate, ProbeBudgetExceeded and drain Events differ exactly when what their
// notes say differs, so client-go's broadcaster never merges a different note into the series of
// an earlier Event (TestADifferentDrainNoteIsAnEventOfItsOwn shows it with the real broadcaster
// for drains).
func TestEventActionsDifferWithTheirNotes(t *testing.T) {
	tests := map[string]struct {
		a, b string
		same bool
	}{
		"another lateness":                  {a: lateAction(1500 * time.Millisecond), b: lateAction(3 * time.Second)},
		"the same lateness":                 {a: lateAction(2 * time.Second), b: lateAction(2 * time.Second), same: true},
		"other budget numbers":              {a: budgetAction(3, 40), b: budgetAction(4, 40)},
		"the same numbers of another total": {a: budgetAction(3, 40), b: budgetAction(3, 41)},
		"the same budget numbers":           {a: budgetAction(3, 40), b: budgetAction(3, 40), same: true},
		"other ports drained":               {a: drainAction([]string{"http"}), b: drainAction([]string{"http", "metrics"})},
		"the same ports drained":            {a: drainAction([]string{"http", "metrics"}), b: drainAction([]string{"http", "metrics"}), same: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.LessOrEqual(t, len(tc.a), eventnote.MaxActionBytes)
			assert.LessOrEqual(t, len(tc.b), eventnote.MaxActionBytes)
			if tc.same {
				assert.Equal(t, tc.a, tc.b)
			} else {
				assert.NotEqual(t, tc.a, tc.b)
			}
		})
	}
	assert.Equal(t, "Probe/late/1.5s", lateAction(1500*time.Millisecond))
	assert.Equal(t, "Probe/budget/3-of-40", budgetAction(3, 40))
	assert.Equal(t, "Drain/http,metrics", drainAction([]string{"http", "metrics"}))
	assert.Equal(t, "Drain", drainAction(nil), "a resource without ports")
}
