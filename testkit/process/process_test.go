// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package process_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/testkit/process"
)

func TestAProgramsOutputGoesToItsLogFileBetweenMarkerLines(t *testing.T) {
	log := filepath.Join(t.TempDir(), "echo.log")
	for run := range 2 {
		p, err := process.Start("echo", exec.Command("sh", "-c", "echo run "+strconv.Itoa(run)+"; exit 3"), process.Options{LogFile: log})
		require.NoError(t, err)
		<-p.Done()
		assert.Equal(t, "exit status 3", p.ExitText())
		require.ErrorContains(t, p.Err(), "echo (pid "+strconv.Itoa(p.PID())+") exited: exit status 3")
		assert.ErrorContains(t, p.Err(), "run "+strconv.Itoa(run), "the error carries the end of the output")
	}
	b, err := os.ReadFile(log)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	require.Len(t, lines, 8, "every run is appended: %q", lines)
	pidLine := func(l string) string {
		if strings.HasPrefix(l, "--- echo: pid ") {
			return "pid line"
		}
		return l
	}
	for run, ls := range [][]string{lines[:4], lines[4:]} {
		assert.True(t, strings.HasPrefix(ls[0], "--- echo: /"), "a run starts with the command: %q", ls)
		// The program may write before its PID line is written.
		assert.ElementsMatch(t, []string{"pid line", "run " + strconv.Itoa(run)}, []string{pidLine(ls[1]), pidLine(ls[2])}, "%q", ls)
		assert.True(t, strings.HasSuffix(ls[3], "exited: exit status 3"), "a run ends with its exit: %q", ls)
	}
}

func TestStopEndsARunningProgramWithSIGTERM(t *testing.T) {
	p, err := process.Start("sleep", exec.Command("sleep", "600"), process.Options{})
	require.NoError(t, err)
	assert.False(t, p.Exited())
	require.NoError(t, p.Err(), "a running program has no error")
	assert.Empty(t, p.ExitText())

	require.NoError(t, p.Stop())
	assert.True(t, p.Exited())
	assert.Equal(t, "signal: terminated", p.ExitText())
	require.NoError(t, p.Stop(), "stopping an exited program is no error")
}

func TestStopKillsAProgramThatIgnoresSIGTERMAfterTheGrace(t *testing.T) {
	// The shell ignores SIGTERM; it says so once the trap is set, so the signal cannot come first.
	cmd := exec.Command("sh", "-c", `trap "" TERM; echo trapped; while :; do sleep 1; done`)
	p, err := process.Start("stubborn", cmd, process.Options{Grace: 200 * time.Millisecond})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return strings.Contains(p.Output(100), "trapped") }, 30*time.Second, 10*time.Millisecond)

	err = p.Stop()
	require.ErrorContains(t, err, "did not exit within 200ms of SIGTERM and was killed")
	assert.Equal(t, "signal: killed", p.ExitText())
}

func TestStopOfAGroupReachesTheWrappersChildren(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child")
	// The wrapper waits for its child, which ignores nothing: SIGTERM to the group ends both.
	cmd := exec.Command("sh", "-c", `sleep 600 & echo $! > `+pidFile+`; wait`)
	p, err := process.Start("wrapper", cmd, process.Options{Group: true})
	require.NoError(t, err)
	var child int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		child, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	}, 30*time.Second, 10*time.Millisecond)
	require.True(t, alive(child), "the child runs")

	require.NoError(t, p.Stop())
	require.Eventually(t, func() bool { return !alive(child) }, 30*time.Second, 10*time.Millisecond,
		"the child is gone with its wrapper")
}

// alive reports whether a process exists and is not a zombie (an orphan's parent may reap it
// late).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

func TestWaitHTTPFailsWhenTheProgramExitsFirst(t *testing.T) {
	p, err := process.Start("short", exec.Command("sh", "-c", "echo bye; exit 1"), process.Options{})
	require.NoError(t, err)
	// Nothing listens on port 1 of the loopback address: only the exit can end the wait.
	err = p.WaitHTTP(t.Context(), "http://127.0.0.1:1/readyz")
	require.ErrorContains(t, err, "short (pid "+strconv.Itoa(p.PID())+") exited: exit status 1")
	assert.ErrorContains(t, err, "bye")
}

func TestStartForTestKeepsTheOutputInMemory(t *testing.T) {
	p := process.StartForTest(t, "echo", exec.Command("echo", "hello"))
	<-p.Done()
	assert.Equal(t, "hello\n", p.Output(1<<10))
	assert.Equal(t, "[...]\nlo\n", p.Output(3), "Output keeps the end")
}
