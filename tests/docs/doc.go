// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package docs tests the user documentation in docs/ against the real thing, so the pages cannot
// drift from the code:
//
//   - Every resource example (a ```yaml block, or a "---" document in it, with apiVersion and
//     kind) of every docs/*.md page is created with server-side dry-run in a fresh namespace of a
//     real kube-apiserver with the module's CRD and the chart's credential-Secret admission
//     policy; a rejected example fails. Blocks without apiVersion/kind are fragments and are
//     skipped. An example that shows what NOT to write carries a comment
//     "# rejected: <part of the message>" and must be rejected with that message. Dry-run
//     keeps the examples independent: order and repeated names do not matter.
//   - ModuleConfig examples (not served by this API server) are validated against
//     openapi/config-values.yaml, and the settings tables of CONFIGURATION.md and
//     CONFIGURATION.ru.md list exactly the leaf settings of that schema.
//   - CR.md and CR.ru.md name every field of the CRD (under spec and status) as a backticked
//     path like `spec.healthcheck.probes[].http.path`, and every such path they name exists in
//     the CRD.
//   - crds/doc-ru-servicewithhealthchecks.yaml has the CRD's structure (properties/items only)
//     with a Russian description wherever the CRD has one. When a field is added to the API,
//     the test names the path whose Russian description is missing.
//   - Every link between pages ([x](PAGE.md#anchor)) points to a page and heading that exist.
//   - The user pages (README, CONFIGURATION, CR, EXAMPLES, FAQ) each have a .ru.md twin that shows
//     the same number of resource examples (CONFIGURATION is exempt until its twin shows the
//     credential Secret example too).
//   - Russian strings the tests need are in testdata/russian.ru.yaml, not in Go sources.
//
// Run: cd tests && go test ./docs/
package docs
