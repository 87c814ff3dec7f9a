// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package process

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// PeakRSS is a process's peak resident set size (VmHWM of /proc/<pid>/status), in bytes.
func PeakRSS(pid int) (int64, error) { return statusBytes(pid, "VmHWM") }

// RSS is a process's resident set size now (VmRSS of /proc/<pid>/status), in bytes.
func RSS(pid int) (int64, error) { return statusBytes(pid, "VmRSS") }

// statusBytes reads a "<field>: <n> kB" line of /proc/<pid>/status.
func statusBytes(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("reading /proc/%d/status: %w", pid, err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing %s %q: %w", field, v, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// CPUTime is a process's user and system CPU time (utime and stime of /proc/<pid>/stat, in
// clock ticks of 1/100 s on Linux).
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("reading /proc/%d/stat: %w", pid, err)
	}
	s := string(b)
	// The fields after the command name, which is in parentheses and may hold spaces.
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return 0, fmt.Errorf("parsing /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("parsing /proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("parsing /proc/%d/stat: %w", pid, err)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// LoadAvg is the machine's load average over 1, 5 and 15 minutes ("1.02 0.80 0.55"), or "?".
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
