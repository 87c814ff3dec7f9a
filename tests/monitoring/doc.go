// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package monitoring checks monitoring/ and docs/METRICS*.md against the programs. It is its own
// Go module, outside go.work, because it needs github.com/prometheus/prometheus (the PromQL
// parser), which must not change the product's dependency versions (DESIGN §9).
//
//   - Every PromQL expression of the alert rules and of every dashboard target parses with the
//     Prometheus parser, and every metric it names is one the programs register (their hidden
//     describe-metrics command lists the collectors' Describe) or is on the allow-list below.
//   - promtool (tools/kube, built by tools/build.sh) checks the rules and runs the unit tests
//     in monitoring/prometheus-rules/tests; every alert has a case where it fires and one where
//     it does not.
//   - docs/METRICS.md and docs/METRICS.ru.md list exactly the programs' metrics, with their types
//     and labels, and every alert.
package monitoring
