// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package version is the version the programs were built as: hack/build-images.sh sets Version
// and Revision with -ldflags -X (development/RELEASING.md, "Versions in the programs"); a
// build without them (go build, go test) is "dev" at an "unknown" revision.
package version

import (
	"fmt"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// Version is the module's release without the "v" (the newest release recorded in CHANGELOG.md
// and Chart.yaml's appVersion when built by hack/build-images.sh), or "dev".
var Version = "dev"

// Revision is the git commit the program was built from, or "unknown".
var Revision = "unknown"

// GoVersion is the Go release the program was built with.
func GoVersion() string { return runtime.Version() }

// Line is what --version prints: "<program> <version> (revision <commit>, <go version>)".
func Line(program string) string {
	return fmt.Sprintf("%s %s (revision %s, %s)\n", program, Version, Revision, GoVersion())
}

// BuildInfo is the program's <name> gauge: one series of value 1 whose labels are the version,
// the git revision and the Go version it was built as (the usual build_info shape, so a query
// can join it onto the program's other series). Register it with the program's metrics.
func BuildInfo(name string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: name,
		Help: "Always 1; the labels are the version, the git revision and the Go version the program was built as.",
	}, []string{"version", "revision", "goversion"})
	g.WithLabelValues(Version, Revision, GoVersion()).Set(1)
	return g
}
