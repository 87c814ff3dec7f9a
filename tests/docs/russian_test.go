// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package docs

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// russianData is testdata/russian.ru.yaml: the tests' Russian strings, kept out of Go sources.
type russianData struct {
	Anchors []struct {
		Name    string `json:"name"`
		Heading string `json:"heading"`
		Anchor  string `json:"anchor"`
	} `json:"anchors"`
	SettingsTableHeads []string `json:"settingsTableHeads"`
}

func readRussianData(t *testing.T) russianData {
	t.Helper()
	raw, err := os.ReadFile("testdata/russian.ru.yaml")
	require.NoError(t, err)
	var d russianData
	require.NoError(t, yaml.UnmarshalStrict(raw, &d))
	require.NotEmpty(t, d.Anchors, "testdata/russian.ru.yaml has anchors")
	require.NotEmpty(t, d.SettingsTableHeads, "testdata/russian.ru.yaml has the settings table heads")
	return d
}
