// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package memlimit sets the Go runtime's soft memory limit (GOMEMLIMIT) below the container's
// memory limit, which the chart passes to both programs as $MEMORY_LIMIT from the downward API.
package memlimit

import (
	"math"
	"runtime/debug"
	"strconv"
)

// memoryLimitFraction is the part of the container's memory limit the Go runtime aims to stay
// under (its soft limit, GOMEMLIMIT). At 100 % the garbage collector only works hard once the
// process is already at the kernel's kill line: a burst of allocation between two collections,
// and the memory the runtime holds but does not count as heap (stacks, freed pages not yet
// returned, its own metadata), end in an OOM kill. 85 % leaves about 77 MiB of a 512 MiB limit
// for those (development/AGENT.md, "Probe budget"; development/CONTROLLER.md, "Memory").
const memoryLimitFraction = 0.85

// Limit is the Go runtime's soft memory limit for a container limit, in bytes, as the
// chart passes it ($MEMORY_LIMIT, from the downward API): memoryLimitFraction of it. ok is false
// when there is nothing to set: $GOMEMLIMIT is set (the runtime read it and it wins), or the
// limit is absent or not a positive number of bytes.
func Limit(getenv func(string) string) (int64, bool) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, false
	}
	limit, err := strconv.ParseInt(getenv("MEMORY_LIMIT"), 10, 64)
	if err != nil || limit <= 0 {
		return 0, false
	}
	return int64(math.Floor(float64(limit) * memoryLimitFraction)), true
}

// Set sets the runtime's soft memory limit from the container's (Limit).
func Set(getenv func(string) string) {
	if limit, ok := Limit(getenv); ok {
		debug.SetMemoryLimit(limit)
	}
}
