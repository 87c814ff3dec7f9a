# service-with-healthchecks: the one entry point for building, testing and running the module.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

# Go modules of the product, joined by go.work. `go test ./...` does not cross modules at the
# workspace root, so every target lists them.
MODULES := api lib testkit images/agent images/controller hooks tests
# Modules outside go.work because they pull github.com/prometheus/prometheus (DESIGN §9): tested,
# tidied, built and linted alone (GOWORK=off).
STANDALONE := tests/monitoring
# The benchmarks' modules (outside go.work, each replacing the workspace modules it drives): make
# verify keeps them tidy and building, so a version raised in the workspace cannot leave them
# broken until the next benchmark run.
BENCHMODULES := $(patsubst %/go.mod,%,$(wildcard bench/*/go.mod))

KUBE_BIN    = $(shell tools/build.sh --dir kube)
CODEGEN_BIN = $(shell tools/build.sh --dir codegen)
LINT_BIN    = $(shell tools/build.sh --dir lint)
# dmt, Deckhouse's module linter, comes with the team's shared tools beside the checkout.
DMT         = $(CURDIR)/../shared/tools/dmt/dmt.sh

# Packages run in parallel across modules; the control-plane tests are the slow ones. -vet=off:
# go test's own vet subset type-checks every tested package a second time, and `make verify` runs
# go vet with every analyzer on every module (`make lint` golangci-lint's govet), so CI loses
# nothing by it and a fresh run saves its minutes.
GO_TEST_FLAGS ?= -count=1 -timeout=30m -vet=off
export KUBEBUILDER_ASSETS = $(KUBE_BIN)
# module-sdk and oci-tools are served by the proxy but missing from the checksum database.
export GONOSUMDB = github.com/deckhouse,github.com/sylabs

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: deps
deps: ## Install the Debian packages the tests need (iproute2, nftables, postgresql-15, mariadb-server, redis-server); as root.
	@hack/deps.sh

.PHONY: tools
tools: test-tools ## Build every pinned tool (the tests' and the linters': controller-gen, golangci-lint) into the cache.
	@tools/build.sh codegen lint

.PHONY: test-tools
test-tools: ## Build only the tools the tests run (kube-apiserver, etcd, kube-proxy, kube-controller-manager and promtool in one group; kube-rbac-proxy).
	@tools/build.sh kube kube-rbac-proxy

.PHONY: generate
generate: ## Regenerate deepcopy code and the CRD from the Go types.
	@tools/build.sh codegen
	cd api && $(CODEGEN_BIN)/controller-gen object paths=./...
	cd api && $(CODEGEN_BIN)/controller-gen crd paths=./... output:crd:stdout > ../crds/servicewithhealthchecks.yaml.tmp
	hack/crd-header.sh < crds/servicewithhealthchecks.yaml.tmp > crds/servicewithhealthchecks.yaml
	rm -f crds/servicewithhealthchecks.yaml.tmp

# make verify and make lint compile with make test's configuration (hack/test.sh: CGO_ENABLED=0,
# -trimpath), so they reuse its build cache instead of compiling every dependency again: with gcc
# installed, go's default is CGO_ENABLED=1, and a different configuration is a different cache key.
verify lint: export CGO_ENABLED := 0
verify lint: export GOFLAGS := $(if $(filter -trimpath,$(GOFLAGS)),$(GOFLAGS),$(strip $(GOFLAGS) -trimpath))

.PHONY: verify
verify: ## Fail when anything generated is out of date (generated into a copy: the checkout is only read); check go.mod tidiness.
	@hack/verify-generated.sh
	@for m in $(MODULES) $(STANDALONE) $(BENCHMODULES); do (cd $$m && GOWORK=off go mod tidy -diff >/dev/null) || { echo "verify: $$m/go.mod is not tidy: run 'cd $$m && GOWORK=off go mod tidy'" >&2; exit 1; }; done
	@for m in $(MODULES) $(STANDALONE); do (cd $$m && GOWORK=off go build ./... && GOWORK=off go vet ./...) || { echo "verify: $$m does not build alone (GOWORK=off)" >&2; exit 1; }; done
	@# go vet compiles the benchmarks (and their tests) without writing their one main package's binary into the checkout, as go build would.
	@for m in $(BENCHMODULES); do (cd $$m && GOWORK=off go vet ./...) || { echo "verify: $$m does not build alone (GOWORK=off)" >&2; exit 1; }; done
	@# The test tools and the modules compile one copy of what they share (development/TEST-HARNESS.md).
	@go run ./tests/internal/cmd/toolversions -check

.PHONY: lint
lint: ## Run golangci-lint on every module, check the license headers, and run dmt (Deckhouse's module linter) when the shared tools are there.
	@tools/build.sh lint
	@for m in $(MODULES); do echo "lint: $$m"; (cd $$m && $(LINT_BIN)/golangci-lint run --config $(CURDIR)/.golangci.yaml ./...); done
	@for m in $(STANDALONE); do echo "lint: $$m"; (cd $$m && GOWORK=off $(LINT_BIN)/golangci-lint run --config $(CURDIR)/.golangci.yaml ./...); done
	@echo "lint: license headers"; hack/license-headers.sh --check
	@# dmt leaves empty temporary directories behind (two per run, in $$TMPDIR): give it its own.
	@if [[ -f $(DMT) ]]; then echo "lint: dmt"; tmp="$$(mktemp -d)" && trap 'rm -rf "$$tmp"' EXIT && TMPDIR="$$tmp" bash $(DMT) lint .; else echo "lint: dmt skipped: $(DMT) is not there"; fi

.PHONY: build
build: ## Build the programs and the hooks binary as static binaries into bin/ (the script werf runs).
	hack/build-images.sh --out bin

.PHONY: release
release: ## Cut a release: make release VERSION=x.y.z [TAG=1] (clean tree, CHANGELOG.md's Unreleased becomes vx.y.z; development/RELEASING.md).
	@hack/release.sh $(if $(TAG),--tag) "$(VERSION)"

.PHONY: test
test: deps ## Run every test of every module (real API server, real servers); builds what it needs first.
	@# The Kubernetes binaries and promtool first; hack/test.sh builds kube-rbac-proxy beside the first tests.
	@tools/build.sh kube
	@GO_TEST_FLAGS="$(GO_TEST_FLAGS)" MODULES="$(MODULES)" STANDALONE="$(STANDALONE)" hack/test.sh

.PHONY: test-nodes
test-nodes: deps ## Run the end-to-end scenarios on real nodes (a kubelet and containerd per node, tests/e2e/realnode) and the `make run NODES=real` smoke test; builds the node and containerd tool groups.
	@tools/build.sh kube node containerd
	@cd tests && CGO_ENABLED=0 GOFLAGS="$${GOFLAGS:+$$GOFLAGS }-trimpath" SWH_REAL_NODES=1 go test $(GO_TEST_FLAGS) -run RealNode ./e2e/realnode/
	@cd testkit && CGO_ENABLED=0 GOFLAGS="$${GOFLAGS:+$$GOFLAGS }-trimpath" SWH_REAL_NODES=1 go test $(GO_TEST_FLAGS) -run RealNode ./cmd/swh-run/

.PHONY: test-cilium
test-cilium: ## Run the scenarios whose dataplane is a real cilium-agent (kube-proxy replacement; go test -run Cilium in testkit/cluster, testkit/cmd/swh-run and tests/); builds the cilium tool group first (a quarter of an hour the first time).
	@hack/deps.sh --cilium
	@tools/build.sh kube cilium
	@# One go test for both modules (the workspace), the longest packages first: two run at a time.
	@CGO_ENABLED=0 GOFLAGS="$${GOFLAGS:+$$GOFLAGS }-trimpath" SWH_CILIUM=1 go test $(GO_TEST_FLAGS) -run Cilium ./testkit/cluster/ ./tests/e2e/traffic/ ./tests/e2e/lb/ ./testkit/cmd/swh-run/ ./tests/...

.PHONY: test-race
test-race: deps test-tools ## Run the agent's, the controller's and testkit's tests with -race and the informer-cache mutation detector (hack/test-race.sh); PKGS="./x/..." picks packages.
	@hack/test-race.sh $(PKGS)

.PHONY: bench
bench: deps tools ## Run every benchmark suite (bench/run.sh: bench/*/run.sh in order) and print one markdown report; BENCH_SUITES="a b" picks suites.
	bench/run.sh

.PHONY: bench-probes
bench-probes: deps ## Benchmark our TCP/HTTP/PostgreSQL probers and the kubelet's TCP/HTTP probers (development/BENCHMARKS.md).
	bench/probes/run.sh

# NODES=real runs `make run`'s pods on real nodes (a kubelet and containerd each); empty: network
# namespace pods (development/RUN.md, "On real nodes").
NODES ?=
# DATAPLANE=cilium routes `make run`'s Services with a real cilium-agent (kube-proxy replacement)
# instead of kube-proxy (development/RUN.md, "On Cilium"); empty: kube-proxy.
DATAPLANE ?=

.PHONY: run
run: ## Run the product on a local demo cluster with a live view until Ctrl-C (root; development/RUN.md). ARGS="--exit-after-ready" for a smoke run; NODES=real on real kubelet nodes; DATAPLANE=cilium with cilium-agent instead of kube-proxy.
	@if [[ $$(id -u) -ne 0 ]]; then echo "make run: needs root: it creates network namespaces, veth pairs and nftables rules and runs PostgreSQL as the postgres user; run \`sudo make run\`" >&2; exit 1; fi
	@case "$(NODES)" in ""|real) ;; *) echo "make run: NODES=$(NODES): want NODES=real (real kubelet nodes) or no NODES (network namespace pods)" >&2; exit 1;; esac
	@case "$(DATAPLANE)" in ""|kube-proxy|cilium) ;; *) echo "make run: DATAPLANE=$(DATAPLANE): want DATAPLANE=cilium or no DATAPLANE (kube-proxy)" >&2; exit 1;; esac
	@# The packages, the tools, the program's build, then the program: one line per step with its time.
	@hack/run.sh $(if $(filter real,$(NODES)),--nodes=real) $(if $(filter cilium,$(DATAPLANE)),--dataplane=cilium) $(ARGS)

.PHONY: run-ctl
run-ctl: ## Control a running `make run` from a second terminal: make run-ctl ARGS="stop-smtp" (ARGS=help lists the commands).
	@cd testkit && go run ./cmd/swh-run ctl $(ARGS)
