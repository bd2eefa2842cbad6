# gpufleet — see README.md. Two set-up commands: `make dev` and `make test`.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

BIN := $(CURDIR)/bin
export GPUFLEET_BIN_DIR := $(BIN)
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/gpufleet/gpufleet/internal/version.Version=$(VERSION) -X github.com/gpufleet/gpufleet/internal/version.Commit=$(COMMIT)
CONTROLLER_GEN := $(BIN)/controller-gen
# Integration test packages start their own local cluster; run packages one at a time on 2 cores.
# -race: every test runs under the race detector.
GOTEST_FLAGS ?= -race -count=1 -p 1 -timeout 45m
# make image: the platforms of the image index.
IMAGE_PLATFORMS ?= linux/amd64 linux/arm64

.PHONY: all
all: build

.PHONY: tools
tools: ## Build the pinned tools and control-plane binaries into bin/ (first time ~15 min).
	hack/build-tools.sh all

.PHONY: controlplane
controlplane: ## Build only the local control plane into bin/ (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok): what gpufleet dev needs.
	hack/build-tools.sh controlplane

.PHONY: controller-gen
controller-gen:
	hack/build-tools.sh controller-gen

.PHONY: generate
generate: controller-gen ## Regenerate deepcopy, CRDs and RBAC from the Go types and markers.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=gpufleet-operator paths=./internal/... output:rbac:artifacts:config=config/rbac
	hack/sync-chart.sh

.PHONY: crd-ref-docs
crd-ref-docs:
	hack/build-tools.sh crd-ref-docs

.PHONY: docs
docs: crd-ref-docs ## Regenerate docs/reference/: the API (crd-ref-docs), every gpufleet command and flag (cobra), the operator's metrics.
	CRD_REF_DOCS=$(BIN)/crd-ref-docs hack/api-docs.sh
	rm -rf docs/reference/cli
	go run -tags gendocs ./cmd/gpufleet docs/reference/cli
	go run ./hack/metricsdoc docs/reference/metrics.md

.PHONY: helm
helm:
	hack/build-tools.sh helm

.PHONY: golangci-lint
golangci-lint:
	hack/build-tools.sh golangci-lint

.PHONY: lint
lint: golangci-lint ## Run golangci-lint (configuration in .golangci.yml).
	$(BIN)/golangci-lint run ./...

.PHONY: lint-chart
lint-chart: helm ## helm lint --strict the chart.
	$(BIN)/helm lint --strict charts/gpufleet

.PHONY: promtool
promtool:
	hack/build-tools.sh promtool

.PHONY: test-fuzz
test-fuzz: ## Run every fuzz target for FUZZTIME (default 10s) each; a failing input is saved under the package's testdata/fuzz/.
	hack/fuzz.sh

.PHONY: test-rules
test-rules: promtool ## promtool check and unit-test the alerting rules; check the dashboards (make test runs these too, in test/monitoring).
	$(BIN)/promtool check rules charts/gpufleet/rules/gpufleet.rules.yaml
	$(BIN)/promtool test rules charts/gpufleet/rules/gpufleet.rules_test.yaml
	go test -count=1 -short ./test/monitoring/

.PHONY: build
build: ## Build bin/gpufleet and bin/gpufleet-agent (the node agent alone, what the agent DaemonSet runs).
	go build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/gpufleet ./cmd/gpufleet
	go build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/gpufleet-agent ./cmd/gpufleet-agent

.PHONY: dev
dev: controlplane build ## Start the local cluster with simulated GPU nodes and the operator (Ctrl-C to stop).
	$(BIN)/gpufleet dev $(DEV_ARGS)

.PHONY: test
test: tools ## Run unit and integration tests (builds what it needs).
	go test $(GOTEST_FLAGS) ./...

.PHONY: test-browser
test-browser: tools ## The fleet view (gpufleet ui) in headless Chromium against the local cluster; installs Debian's chromium when missing; screenshot in results/fleet-view.png.
	hack/ensure-chromium.sh
	go test $(GOTEST_FLAGS) -tags browser -v -run TestFleetViewInBrowser ./internal/fleet/ui/

.PHONY: unit
unit: ## Unit tests only (no local cluster).
	go test -count=1 -short ./...

.PHONY: verify
verify: generate ## Fail if generated files are stale, code is unformatted, go vet or golangci-lint complains.
	@git diff --exit-code -- api config charts && test -z "$$(git ls-files --others --exclude-standard -- api config charts)" || { git ls-files --others --exclude-standard -- api config charts; echo "generated files are stale: run 'make generate' and commit"; exit 1; }
	@$(MAKE) --no-print-directory docs; git diff --exit-code -- docs/reference && test -z "$$(git ls-files --others --exclude-standard -- docs/reference)" || { git ls-files --others --exclude-standard -- docs/reference; echo "docs/reference is stale: run 'make docs' and commit"; exit 1; }
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	go vet ./...
	$(MAKE) --no-print-directory lint

.PHONY: bench
bench: tools ## Planner micro-benchmarks and scale scenarios on the local cluster; reports in results/.
	mkdir -p results
	{ echo "# gpufleet bench $$(date -u +%FT%TZ) $$(git rev-parse --short HEAD)"; \
	  go test -count=1 -run '^$$' -bench 'BenchmarkMakePlan' -benchmem ./internal/maintenance/; \
	  go test -count=1 -run '^$$' -bench 'BenchmarkScaleRollout' -benchtime 1x -timeout 60m ./test/chaos/ -args $(SCALE_ARGS); \
	  go test -count=1 -run '^$$' -bench 'BenchmarkScaleRollout' -benchtime 1x -timeout 30m ./test/chaos/ -args -scale.nodes=100 -scale.pods-per-node=10 -scale.max-parallel=10 -scale.max-unavailable=11 -scale.pdbs=false -scale.open-after-create; \
	  go test -count=1 -run '^$$' -bench 'BenchmarkNVLinkDomainRollout' -benchtime 1x -timeout 30m ./test/chaos/; \
	  go test -count=1 -run '^$$' -bench 'BenchmarkNVLinkDomainRollout' -benchtime 1x -timeout 30m ./test/chaos/ -args -domains.held; \
	  go test -count=1 -run '^$$' -bench 'BenchmarkClusterPolicyScale' -benchtime 1x -timeout 30m ./internal/gpustack/ -args -gpustack.nodes=20; \
	  go test -count=1 -run '^$$' -bench 'BenchmarkClusterPolicyScale' -benchtime 1x -timeout 30m ./internal/gpustack/ -args -gpustack.nodes=100; \
	  go test -count=1 -run '^$$' -bench 'BenchmarkHealthyFleet500' -benchtime 1x -timeout 30m ./internal/repair/; \
	  go test -count=1 -run '^$$' -bench 'BenchmarkOperatorMemory' -benchtime 1x -timeout 60m ./test/chaos/ -args -chaos.heap-profile=$(CURDIR)/results/heap.pprof; \
	  go test -count=1 -run '^$$' -bench 'BenchmarkAgentMemory' -benchtime 1x -timeout 20m ./test/chaos/; \
	  go test -count=1 -run '^$$' -bench 'BenchmarkGPUFaultBurst' -benchtime 1x -timeout 60m ./test/chaos/ -args -burst.nodes=1500 -burst.faults=200; \
	} 2>&1 | grep -v '^\s*>' | tee results/bench.txt

SCALE_NODES ?= 10000
# The GPU stack puts a pod per component on every node, each started only
# once the components before it are Ready on the node: on 2 cores 1,000
# nodes' 6,000 stack pods were not all Running after 10 minutes, so its
# part runs at this size.
GPUSTACK_NODES ?= 1000
.PHONY: bench-scale
bench-scale: tools ## Every capability at SCALE_NODES simulated nodes (default 10,000; about two hours on 2 cores): operator memory, heartbeats, gpufleet status and gpufleet ui at rest, a 1,000-object maintenance rollout with pools and a window against kubectl, the node agents' API load, a burst of SCALE_NODES/10 GPU faults to isolation, the ClusterPolicy to ready and a driver upgrade at GPUSTACK_NODES (default 1,000), the decision cores at 1k/3k/10k; reports in results/, gathered in results/scale-<N/1000>k.{json,md}.
	mkdir -p results
	{ echo "# gpufleet bench-scale $$(date -u +%FT%TZ) $$(git rev-parse --short HEAD) SCALE_NODES=$(SCALE_NODES)"; \
	  go test -count=1 -run '^$$' -bench 'BenchmarkMakePlan' -benchmem -benchtime 5x ./internal/maintenance/; \
	  go test -count=1 -run '^$$' -bench 'BenchmarkDetect|BenchmarkPlanUpgrades' -benchmem -benchtime 20x ./internal/repair/ ./internal/gpustack/; \
	  go test -count=1 -run '^$$' -bench 'BenchmarkBuild' -benchmem -benchtime 5x ./internal/fleet/; \
	  go test -count=1 -run '^$$' -bench 'BenchmarkOperatorMemory' -benchtime 1x -timeout 120m ./test/chaos/ -args -memory.nodes=$(SCALE_NODES) -memory.wait-running=false -chaos.memory-env=,GOMEMLIMIT=921MiB; \
	  go test -count=1 -run '^$$' -bench 'BenchmarkScaleRollout' -benchtime 1x -timeout 120m ./test/chaos/ -args -scale.nodes=$(SCALE_NODES) -scale.objects=1000 -scale.pods-per-node=0 -scale.max-parallel=50 -scale.max-unavailable=51 -scale.pools=16 -scale.pool-max-parallel=4 -scale.window -scale.idle=30s -scale.open-after-create; \
	  go test -count=1 -run '^$$' -bench 'BenchmarkAgentAPILoad' -benchtime 1x -timeout 30m ./test/chaos/ -args -agentload.agents=200 -agentload.scale-to=$(SCALE_NODES); \
	  go test -count=1 -run '^$$' -bench 'BenchmarkGPUFaultBurst' -benchtime 1x -timeout 90m ./test/chaos/ -args -burst.nodes=$(SCALE_NODES) -burst.faults=$$(($(SCALE_NODES)/10)) -burst.pods-per-node=0 -burst.until=isolated -burst.agent-workers=64 -burst.observe=5m; \
	  go test -count=1 -run '^$$' -bench 'BenchmarkClusterPolicyScale' -benchtime 1x -timeout 90m ./internal/gpustack/ -args -gpustack.nodes=$(GPUSTACK_NODES) -gpustack.ready-timeout=30m; \
	} 2>&1 | grep -v '^\s*>' | tee results/bench-scale.txt
	go run ./hack/scalereport -dir results -nodes $(SCALE_NODES) -gpustack-nodes $(GPUSTACK_NODES)

.PHONY: chaos
chaos: tools ## NodeMaintenance rollout of 50 objects with 15 operator SIGKILLs and a kube-apiserver restart.
	go test -count=1 -v -timeout 30m ./test/chaos/ -args -chaos.objects=50 -chaos.kills=15

.PHONY: image
image: ## Build the container image (linux/amd64, linux/arm64) as an OCI archive in _output/image/, without a container engine or registry.
	VERSION=$(VERSION) COMMIT=$(COMMIT) LDFLAGS="$(LDFLAGS)" PLATFORMS="$(IMAGE_PLATFORMS)" hack/image.sh

.PHONY: test-image
test-image: helm ## Build a release in a temporary directory and check the image (entrypoint, user, labels, files, the binary runs, nsenter), the chart and install.yaml.
	go vet -tags image ./test/image/
	go test -tags image -count=1 -v -timeout 30m ./test/image/

.PHONY: release
release: helm ## Release artifacts in _output/release/VERSION/: image archive, chart, install.yaml, SHA256SUMS (make release VERSION=v0.2.0).
	VERSION=$(VERSION) COMMIT=$(COMMIT) LDFLAGS="$(LDFLAGS)" hack/release.sh

.PHONY: set-version
set-version: ## Stamp VERSION into the chart (version, appVersion) and config/default's image tag (make set-version VERSION=v0.2.0).
	VERSION=$(VERSION) hack/set-version.sh

.PHONY: clean
clean:
	rm -rf $(BIN)/gpufleet results
