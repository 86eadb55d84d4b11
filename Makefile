# Keelson: the user's entry points, in the operator-sdk tradition.
#   make demo      local cluster + operator + the tutorial's walk-through
#   make test      every test (starts what it needs)
SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO ?= cargo
# kubectl: yours if on PATH, else the one built for the local cluster.
KUBECTL ?= $(shell command -v kubectl 2>/dev/null || echo "$$(hack/k8s-binaries.sh)/kubectl")
KEELSON := target/debug/keelson
NAMESPACE ?= keelson-system
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
# The operator's image; MyDatabase pods copy the instance manager from the same image.
IMG ?= keelson:$(VERSION)

.PHONY: help
help: ## Show the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

##@ Development
.PHONY: build
build: ## Build the keelson binary
	$(CARGO) build --bin keelson

# Where `make install-plugin` links kubectl-keelson (a folder on your PATH).
PLUGIN_DIR ?= $(HOME)/.local/bin

.PHONY: install-plugin
install-plugin: build ## Link the kubectl plugin (kubectl keelson …) into PLUGIN_DIR
	@mkdir -p $(PLUGIN_DIR)
	ln -sf $(abspath $(KEELSON)) $(PLUGIN_DIR)/kubectl-keelson
	@echo "kubectl keelson --help   (PLUGIN_DIR=$(PLUGIN_DIR) must be on PATH)"

.PHONY: manifests
manifests: build ## Regenerate config/ (CRDs, RBAC, manager) from the Rust types
	$(KEELSON) manifests write --root .

.PHONY: lint
lint: ## cargo fmt --check and clippy -D warnings
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

.PHONY: test
test: ## Unit and integration tests; builds/starts the local cluster and PostgreSQL as needed
	hack/test.sh

.PHONY: bench
bench: ## Benchmark: 1000 WebApps, drift latency, idle writes, memory; writes docs/benchmarks.md
	hack/bench.sh full

.PHONY: bench-scale
bench-scale: ## The benchmark at N = 100, 1000, 3000, 10000 (KEELSON_SCALE_N="..." to choose); writes docs/bench-scale.md
	hack/bench.sh scale

.PHONY: bench-ha
bench-ha: ## Failover and switchover write downtime over 10 runs each, real PostgreSQL pods; writes docs/bench/ha.md
	hack/bench.sh ha

.PHONY: bench-quick
bench-quick: ## The same benchmark at N=100 (under 3 minutes)
	hack/bench.sh quick

##@ Local cluster
.PHONY: cluster-up
cluster-up: ## Start the local cluster: control plane, KWOK fake nodes, one real node (containerd, kubelet, kube-proxy, CoreDNS)
	hack/cluster.sh up

.PHONY: cluster-down
cluster-down: ## Stop the local cluster (and a demo operator) and undo its mounts, bridge and rules
	hack/demo.sh stop-operator
	hack/cluster.sh down

.PHONY: demo
demo: ## Local cluster, operator in the background, the tutorial's walk-through
	hack/demo.sh

##@ Deployment (against the current KUBECONFIG)
.PHONY: install
install: build ## Install the CRDs
	$(KEELSON) manifests crd | $(KUBECTL) apply --server-side -f -

.PHONY: uninstall
uninstall: build ## Remove the CRDs (and with them every WebApp and MyDatabase)
	$(KEELSON) manifests crd | $(KUBECTL) delete --ignore-not-found -f -

.PHONY: run
run: build ## Run the operator in the foreground against the current cluster (Ctrl-C stops it)
	$(KEELSON) run --metrics-addr 127.0.0.1:8080 --health-addr 127.0.0.1:8081

.PHONY: deploy
deploy: build ## Deploy CRDs, RBAC and the manager (image IMG) into keelson-system
	$(KEELSON) manifests all --image $(IMG) | $(KUBECTL) apply --server-side --force-conflicts -f -

.PHONY: undeploy
undeploy: build ## Remove what deploy created (CRDs last: every WebApp and MyDatabase goes with them)
	$(KEELSON) manifests all --image $(IMG) | $(KUBECTL) delete --ignore-not-found -f -

.PHONY: build-installer
build-installer: build ## Write dist/install.yaml: everything deploy applies, with image IMG
	@mkdir -p dist
	$(KEELSON) manifests all --image $(IMG) > dist/install.yaml
	@echo "wrote dist/install.yaml (image $(IMG))"

.PHONY: docker-build
docker-build: ## Build image IMG: with docker if a daemon runs, else offline into the local cluster's nodes
	@if docker info >/dev/null 2>&1; then \
	  docker build -t $(IMG) . ; \
	else \
	  echo "no docker: building $(IMG) offline from this build's binary into the local cluster's nodes"; \
	  $(CARGO) build --bin keelson && hack/cluster.sh keelson-image $(KEELSON) $(IMG) ; \
	fi

.PHONY: docker-push
docker-push: ## Push image IMG to its registry (needs docker and a reachable registry)
	@docker info >/dev/null 2>&1 || { echo "docker-push needs a running docker; on this machine images go to the local cluster with make docker-build" >&2; exit 1; }
	docker push $(IMG)
