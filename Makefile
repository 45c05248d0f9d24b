# webhook-operator: see README.md for the two commands that matter (make demo, make test).
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

ROOT            := $(abspath .)
BIN             := $(ROOT)/bin
KUBEBUILDER_ASSETS := $(BIN)/k8s
CONTROLLER_GEN  := $(BIN)/controller-gen
HELM            := $(BIN)/helm
KUBECTL         := $(BIN)/k8s/kubectl
VERSION         ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS         := -s -w -X github.com/webhook-operator/webhook-operator/internal/version.Version=$(VERSION)
GO_TEST_FLAGS   ?= -count=1
OPENAPI_PKG     := github.com/webhook-operator/webhook-operator/internal/dataapi/openapi
export KUBEBUILDER_ASSETS

.PHONY: all
all: build

##@ Tools (built from the Go module proxy into bin/ by hack/build-tools.sh)
# Every target below depends on the tools it runs, so any target works as the first command on
# a fresh clone. The tool targets are phony: hack/build-tools.sh reuses a tool already built at
# its pinned version (the .version stamp next to it) in well under a second, and rebuilds one
# whose pinned version changed. test/make checks that each target depends on what it needs.

.PHONY: tools
tools: control-plane controller-gen helm ## Build every pinned tool: kube-apiserver, etcd, kubectl, controller-gen, helm.

.PHONY: control-plane
control-plane: ## Build the envtest control plane (kube-apiserver, etcd, kubectl).
	hack/build-tools.sh etcd kube

.PHONY: controller-gen
controller-gen: ## Build controller-gen.
	hack/build-tools.sh controller-gen

.PHONY: helm
helm: ## Build helm.
	hack/build-tools.sh helm

##@ Generated code

.PHONY: generate
generate: controller-gen ## Generate deepcopy code, the typed apply configurations (api/applyconfiguration) and the data API's OpenAPI definitions.
	rm -rf api/applyconfiguration
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt applyconfiguration:headerFile=hack/boilerplate.go.txt paths=./api/...
	go tool openapi-gen --output-dir internal/dataapi/openapi --output-pkg $(OPENAPI_PKG) --output-file zz_generated.openapi.go \
		--output-model-name-file zz_generated.model_name.go --go-header-file hack/boilerplate.go.txt --report-filename /dev/null \
		--readonly-pkg k8s.io/apimachinery/pkg/apis/meta/v1 --readonly-pkg k8s.io/apimachinery/pkg/runtime --readonly-pkg k8s.io/apimachinery/pkg/version \
		./api/data/v1alpha1 k8s.io/apimachinery/pkg/apis/meta/v1 k8s.io/apimachinery/pkg/runtime k8s.io/apimachinery/pkg/version

.PHONY: manifests
manifests: controller-gen ## Generate CRDs and RBAC into config/ and the chart's CRDs and ClusterRole rules; the API reference.
	$(CONTROLLER_GEN) crd:generateEmbeddedObjectMeta=false rbac:roleName=webhook-operator-controller \
		paths=./api/... paths=./controllers/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	hack/sync-chart-crds.sh
	hack/sync-chart-rbac.sh
	go run ./hack/apidocs > docs/api.md

.PHONY: verify
verify: generate manifests ## Fail when generated files are stale, code is unformatted or vet complains.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	go vet ./...
	@git add -N . && git diff --exit-code -- . ':!bin' || { echo "generated files are stale: run 'make generate manifests' and commit"; exit 1; }

.PHONY: fmt
fmt:
	gofmt -w $$(git ls-files '*.go')

.PHONY: lint
lint: ## gofmt, go vet and staticcheck-like checks that need no download beyond the proxy.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	go vet ./...

##@ Build

.PHONY: build
build: ## Build bin/webhook-operator and bin/kubectl-webhooks.
	CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/webhook-operator ./cmd/webhook-operator
	@if [ -d cmd/kubectl-webhooks ]; then CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/kubectl-webhooks ./cmd/kubectl-webhooks; fi

##@ Demo

.PHONY: demo
demo: control-plane build ## The whole product on one machine, in the foreground; Ctrl-C stops it (DEMO_DURATION=60s: bounded, for CI).
	@# Not -trimpath: the demo finds the checkout (CRDs, hack/demo, bin/) from its source path.
	go build -o $(BIN)/webhook-operator-demo ./cmd/webhook-operator-demo
	exec $(BIN)/webhook-operator-demo

##@ Test

.PHONY: test
test: control-plane helm ## Unit and integration tests against a real kube-apiserver, etcd and nats-server.
	go test $(GO_TEST_FLAGS) ./...

.PHONY: test-race
test-race: control-plane ## The dispatcher, controller and internal packages under the race detector (slower; not part of make test).
	go test $(GO_TEST_FLAGS) -race ./dispatcher/... ./controllers/... ./internal/...

.PHONY: test-faults
test-faults: control-plane ## The full fault suite (test/faults): SIGKILLed dispatchers, nats-server restarts, a 3-node NATS cluster losing nodes, a producer behind a leaf node, a flapping receiver, controller restarts, endpoint deletion, auto-disable and replay; nothing may be lost.
	go test $(GO_TEST_FLAGS) -v -timeout 60m ./test/faults -args -faults.full

##@ Benchmarks

.PHONY: bench
bench: control-plane ## Measure the dispatcher: throughput, latency, isolation, retry backlog, recovery, scale (BENCH_FLAGS=-quick for a short run); results in bench/results/.
	go build -o $(BIN)/bench ./bench/cmd/bench
	$(BIN)/bench $(BENCH_FLAGS)

##@ Real cluster (Linux, root; docs/real-cluster.md)
# A real single-node Kubernetes inside namespaces hack/cluster/cluster.sh makes: the node's
# commands are built like the control plane (first time: 15-25 minutes on two cores), the
# Debian parts (containerd, runc, CNI plugins, nftables) installed by hack/cluster/packages.sh.

IMAGES          := $(BIN)/images
IMAGE           ?= ghcr.io/webhook-operator/webhook-operator
IMAGE_TAG       ?= $(VERSION)
PACK_IMAGE      := $(BIN)/pack-image
CLUSTER         := hack/cluster/cluster.sh

.PHONY: cluster-packages
cluster-packages: ## Install containerd, runc, the CNI plugins and nftables from Debian when missing.
	hack/cluster/packages.sh

.PHONY: cluster-tools
cluster-tools: control-plane ## Build the node's commands (kubelet, kube-controller-manager, kube-scheduler, kube-proxy), CoreDNS, nats-server and Prometheus.
	hack/build-tools.sh node coredns nats-server prometheus
	go build -o $(BIN)/nsforward ./hack/cluster/nsforward
	go build -o $(PACK_IMAGE) ./hack/image

.PHONY: cluster-images
cluster-images: cluster-tools ## Pack the images the node and the cluster tests run: pause, CoreDNS, nats-server.
	CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o $(BIN)/cluster/pause ./hack/cluster/pause
	$(PACK_IMAGE) -o $(IMAGES)/pause.tar -tag localhost/cluster/pause:v1 -base scratch -user 65535:65535 \
		-file /pause=$(BIN)/cluster/pause -entrypoint /pause
	$(PACK_IMAGE) -o $(IMAGES)/coredns.tar -tag localhost/cluster/coredns:$$(cat $(BIN)/coredns.version) \
		-file /coredns=$(BIN)/coredns -entrypoint /coredns -label org.opencontainers.image.version=$$(cat $(BIN)/coredns.version)
	$(PACK_IMAGE) -o $(IMAGES)/nats-server.tar -tag localhost/cluster/nats-server:$$(cat $(BIN)/nats-server.version) \
		-file /nats-server=$(BIN)/nats-server -entrypoint /nats-server -label org.opencontainers.image.version=$$(cat $(BIN)/nats-server.version)

.PHONY: image
image: build cluster-tools ## Pack bin/webhook-operator into the Dockerfile's final stage ($(IMAGE):$(IMAGE_TAG), bin/images/webhook-operator.tar); load it into the node when one runs.
	$(PACK_IMAGE) -o $(IMAGES)/webhook-operator.tar -tag $(IMAGE):$(IMAGE_TAG) -dockerfile Dockerfile \
		-build-arg VERSION=$(VERSION) -source build:/out/webhook-operator=$(BIN)/webhook-operator
	@if $(CLUSTER) status; then $(CLUSTER) load $(IMAGES)/webhook-operator.tar && echo "loaded $(IMAGE):$(IMAGE_TAG) into the node"; fi

.PHONY: cluster
cluster: cluster-packages cluster-images helm ## Start a real single-node Kubernetes (prints KUBECONFIG); make cluster-down stops it and leaves nothing.
	$(CLUSTER) up

.PHONY: cluster-down
cluster-down: ## Stop the real cluster: no process, mount, namespace, interface, cgroup or nftables rule remains.
	$(CLUSTER) down

.PHONY: test-cluster
test-cluster: cluster-packages cluster-images helm ## On a real node it starts and removes: helm install and helm test, the walk-through, what only a kubelet proves, faults, Prometheus with the chart's alerts, uninstall.
	@# One node per machine (fixed addresses, port, kubepods cgroups): a second run waits its turn.
	flock /var/tmp/webhook-operator-cluster.lock go test $(GO_TEST_FLAGS) -v -timeout 60m ./test/cluster -args -cluster

.PHONY: help
help:
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*?##/ { printf "  %-16s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)
