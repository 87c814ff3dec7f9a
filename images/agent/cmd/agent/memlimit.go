// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

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
// for those (development/AGENT.md, "Probe budget").
const memoryLimitFraction = 0.85

// memoryLimit is the Go runtime's soft memory limit for a container limit, in bytes, as the
// chart passes it ($MEMORY_LIMIT, from the downward API): memoryLimitFraction of it. ok is false
// when there is nothing to set: $GOMEMLIMIT is set (the runtime read it and it wins), or the
// limit is absent or not a positive number of bytes.
func memoryLimit(getenv func(string) string) (int64, bool) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, false
	}
	limit, err := strconv.ParseInt(getenv("MEMORY_LIMIT"), 10, 64)
	if err != nil || limit <= 0 {
		return 0, false
	}
	return int64(math.Floor(float64(limit) * memoryLimitFraction)), true
}

// setMemoryLimit sets the runtime's soft memory limit from the container's (memoryLimit).
func setMemoryLimit(getenv func(string) string) {
	if limit, ok := memoryLimit(getenv); ok {
		debug.SetMemoryLimit(limit)
	}
}
