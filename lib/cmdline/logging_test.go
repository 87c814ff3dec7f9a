// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cmdline

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
)

// messages are the messages of the JSON lines in out, each checked to carry a level.
func messages(t *testing.T, out string) []string {
	t.Helper()
	var msgs []string
	for l := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var entry struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		require.NoError(t, json.Unmarshal([]byte(l), &entry), "a JSON line: %q", l)
		require.NotEmpty(t, entry.Level, "the line has a level: %q", l)
		msgs = append(msgs, entry.Msg)
	}
	return msgs
}

func TestTheLogLevelPicksWhatIsLogged(t *testing.T) {
	tests := map[LogLevel][]string{
		LogDebug: {"info", "decision at V(1)", "probe at V(4)", "V(5)", "failure"},
		LogInfo:  {"info", "failure"},
		LogWarn:  {"failure"},
		LogError: {"failure"},
	}
	for level, want := range tests {
		t.Run(string(level)+" logs "+strings.Join(want, ", "), func(t *testing.T) {
			var out bytes.Buffer
			log := NewLogger(level, &out)
			log.Info("info")
			log.V(1).Info("decision at V(1)")
			log.V(4).Info("probe at V(4)")
			log.V(DebugVerbosity).Info("V(5)")
			log.V(DebugVerbosity + 1).Info("V(6)")
			log.Error(errors.New("boom"), "failure")
			assert.Equal(t, want, messages(t, out.String()))
		})
	}
}

func TestSetupLoggerIsControllerRuntimesAndKlogs(t *testing.T) {
	var out bytes.Buffer
	c := Common{LogLevel: LogInfo}
	log := c.SetupLogger(&out)
	t.Cleanup(klog.ClearLogger)
	log.Info("from the program")
	ctrl.Log.WithName("manager").Info("from controller-runtime")
	klog.InfoS("from client-go")
	klog.Flush()
	assert.Equal(t, []string{"from the program", "from controller-runtime", "from client-go"}, messages(t, out.String()))
}
