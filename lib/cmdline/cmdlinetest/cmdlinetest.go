// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package cmdlinetest checks a program's command line from the outside, for the tests of the
// programs built on cmdline: the exit code and the one line it reports.
package cmdlinetest

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/lib/cmdline"
)

// ExitsWithOneLine runs cmd (the program named name, with its arguments and environment) and
// checks that it exits with code, prints nothing on stdout and exactly one line on stderr:
// "<name>: <reason>", the reason containing want, followed by " (see --help)" when, and only
// when, code is cmdline.ExitUsage.
func ExitsWithOneLine(t *testing.T, cmd *exec.Cmd, name string, code int, want string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	exitErr, ok := errors.AsType[*exec.ExitError](cmd.Run())
	require.True(t, ok, "the program fails: %s", stderr.String())
	line := stderr.String()
	assert.Equal(t, code, exitErr.ExitCode(), "stderr: %s", line)
	assert.Contains(t, line, want)
	assert.True(t, strings.HasPrefix(line, name+": "), "the line names the program: %q", line)
	assert.Equal(t, 1, strings.Count(line, "\n"), "one line: %q", line)
	assert.True(t, strings.HasSuffix(line, "\n"), "one whole line: %q", line)
	assert.Equal(t, code == cmdline.ExitUsage, strings.HasSuffix(line, " (see --help)\n"), "only a usage error points to --help: %q", line)
	assert.Empty(t, stdout.String(), "nothing on stdout")
}
