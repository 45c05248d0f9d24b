#!/usr/bin/env bash
# Builds the pinned tools this project needs into bin/ from the Go module proxy:
# a real control plane for envtest (kube-apiserver, etcd), kubectl, controller-gen and helm.
# setup-envtest's download cannot reach its bucket from every machine, so we compile instead.
# Each tool is stamped with its version; a second run reuses what is already built.
#
# For the real single-node cluster (make cluster, make test-cluster; docs/real-cluster.md):
#   node        kubelet, kube-controller-manager, kube-scheduler, kube-proxy into bin/node
#   coredns     CoreDNS, packed as the cluster's DNS image
#   nats-server the nats-server go.mod pins, packed as the in-cluster NATS image
#   keda        KEDA's operator and metrics API server into bin/keda
#   prometheus  prometheus and promtool
# Cold (empty build cache), the node's four commands take 15-25 minutes on two cores, KEDA
# and Prometheus about as long again; with a warm build cache each is a link of seconds.
#
# Usage: hack/build-tools.sh [tool ...]   (default: the envtest tools, not the cluster's)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${ROOT}/bin"
ASSETS="${BIN}/k8s"
WORK="${BIN}/.build"

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
STAGING_VERSION="${STAGING_VERSION:-v0.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
CONTROLLER_GEN_VERSION="${CONTROLLER_GEN_VERSION:-v0.23.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"
KEDA_VERSION="${KEDA_VERSION:-v2.21.0}"
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
# nats-server: exactly the version the product's go.mod pins (the one its tests embed).
NATS_SERVER_VERSION="$(awk '$1 == "github.com/nats-io/nats-server/v2" {print $2; exit}' "${ROOT}/go.mod")"
NODE="${BIN}/node"

mkdir -p "${BIN}" "${ASSETS}" "${WORK}"
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export CGO_ENABLED=0

log() { printf '==> %s\n' "$*" >&2; }

# up_to_date <binary> <version>: true when the binary exists and was built at that version.
up_to_date() { [[ -x "$1" && -f "$1.version" && "$(cat "$1.version")" == "$2" ]]; }
stamp() { echo "$2" >"$1.version"; }

# kube_ldflags: the version stamps kubernetes' own release build sets (hack/lib/version.sh),
# so that the API server reports v1.37.2 (helm checks a chart's kubeVersion against it)
# rather than v0.0.0-master.
kube_ldflags() {
  local v="${KUBE_VERSION#v}" x="-s -w"
  local major="${v%%.*}" rest="${v#*.}"
  local minor="${rest%%.*}"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    x+=" -X ${pkg}.gitVersion=${KUBE_VERSION} -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor}"
    x+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
  done
  echo "${x}"
}

# kube_module prepares the throwaway module that builds Kubernetes' commands: k8s.io/kubernetes
# at KUBE_VERSION with every staging repository it replaces with ./staging/... taken from the
# proxy at the matching v0.x version instead. Every command built from it is listed in
# tools.go, so one `go mod tidy` resolves them all; it is redone only when that list or the
# version changes.
kube_module() {
  local dir="${WORK}/kubernetes-${KUBE_VERSION}"
  mkdir -p "${dir}"
  cd "${dir}"
  local tools
  tools="$(cat <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubectl/pkg/cmd"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
)"
  if [[ -f go.mod && -f tools.go && "$(cat tools.go)" == "${tools}" ]] && grep -q "k8s.io/kubernetes ${KUBE_VERSION}" go.mod; then
    return
  fi
  local gomod
  gomod="$(go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  {
    echo "module kubebuild"
    echo
    echo "go 1.26"
    echo
    echo "require k8s.io/kubernetes ${KUBE_VERSION}"
    echo
    grep -E '^\s*k8s\.io/[^ ]+ => \./staging/' "${gomod}" | awk -v v="${STAGING_VERSION}" '{print "replace " $1 " => " $1 " " v}'
  } >go.mod
  echo "${tools}" >tools.go
  go mod tidy >/dev/null 2>&1 || true
}

build_kube() {
  local want="${KUBE_VERSION}+versioned"
  if up_to_date "${ASSETS}/kube-apiserver" "${want}" && up_to_date "${ASSETS}/kubectl" "${want}"; then
    return
  fi
  log "building kube-apiserver and kubectl ${KUBE_VERSION} (first time: several minutes)"
  (
    kube_module
    go build -trimpath -ldflags "$(kube_ldflags)" -o "${ASSETS}/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
    go build -trimpath -ldflags "$(kube_ldflags)" -o "${ASSETS}/kubectl" k8s.io/kubernetes/cmd/kubectl
  )
  stamp "${ASSETS}/kube-apiserver" "${want}"
  stamp "${ASSETS}/kubectl" "${want}"
  ln -sf k8s/kubectl "${BIN}/kubectl"
}

# build_node: the node's own Kubernetes commands, from the same module as kube-apiserver (one
# `go build` of the four, so the packages they share compile once).
NODE_COMMANDS=(kubelet kube-controller-manager kube-scheduler kube-proxy)
build_node() {
  local want="${KUBE_VERSION}+versioned" c missing=0
  for c in "${NODE_COMMANDS[@]}"; do up_to_date "${NODE}/${c}" "${want}" || missing=1; done
  [[ ${missing} == 1 ]] || return 0
  log "building ${NODE_COMMANDS[*]} ${KUBE_VERSION} (cold: 15-25 minutes on two cores)"
  mkdir -p "${NODE}"
  (
    kube_module
    go build -trimpath -ldflags "$(kube_ldflags)" -o "${NODE}/" "${NODE_COMMANDS[@]/#/k8s.io/kubernetes/cmd/}"
  )
  for c in "${NODE_COMMANDS[@]}"; do stamp "${NODE}/${c}" "${want}"; done
}

build_etcd() {
  if up_to_date "${ASSETS}/etcd" "${ETCD_VERSION}"; then return; fi
  log "building etcd ${ETCD_VERSION}"
  local dir="${WORK}/etcd-${ETCD_VERSION}"
  mkdir -p "${dir}"
  (
    cd "${dir}"
    cat >go.mod <<MOD
module etcdbuild

go 1.26

require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}
MOD
    cat >main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    go mod tidy >/dev/null
    go build -trimpath -ldflags "-s -w" -o "${ASSETS}/etcd" .
  )
  stamp "${ASSETS}/etcd" "${ETCD_VERSION}"
}

go_install() { # name module version [stamp] [ldflags]
  local name="$1" module="$2" version="$3" want="${4:-$3}" ldflags="${5:-}"
  if up_to_date "${BIN}/${name}" "${want}"; then return; fi
  log "building ${name} ${version}"
  GOBIN="${BIN}" go install -ldflags "${ldflags}" "${module}@${version}"
  stamp "${BIN}/${name}" "${want}"
}

build_controller_gen() { go_install controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen "${CONTROLLER_GEN_VERSION}"; }

# helm is linked as its release binaries are: `helm template` and `helm lint` assume the
# Kubernetes version of its client libraries (1.37 for v3.22), not the v1.20 a plain
# `go install` leaves, so a chart's kubeVersion constraint renders without --kube-version.
build_helm() {
  local kube_minor="${HELM_KUBE_MINOR:-37}" x=""
  for pkg in chartutil lint/rules; do
    x+=" -X helm.sh/helm/v3/pkg/${pkg}.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/${pkg}.k8sVersionMinor=${kube_minor}"
  done
  x+=" -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
  go_install helm helm.sh/helm/v3/cmd/helm "${HELM_VERSION}" "${HELM_VERSION}+kube1.${kube_minor}" "${x}"
}

# CoreDNS with its standard plugin set (the main package's, as its release builds).
build_coredns() {
  go_install coredns github.com/coredns/coredns "${COREDNS_VERSION}" "${COREDNS_VERSION}" \
    "-s -w -X github.com/coredns/coredns/coremain.GitCommit=${COREDNS_VERSION}"
}

# nats-server from the product's own module graph: the version go.mod pins, nothing else.
build_nats_server() {
  if up_to_date "${BIN}/nats-server" "${NATS_SERVER_VERSION}"; then return; fi
  log "building nats-server ${NATS_SERVER_VERSION}"
  (cd "${ROOT}" && GOFLAGS="${GOFLAGS/-mod=mod/}" go build -trimpath -ldflags "-s -w" -o "${BIN}/nats-server" github.com/nats-io/nats-server/v2)
  stamp "${BIN}/nats-server" "${NATS_SERVER_VERSION}"
}

# KEDA: its go.mod has a replace directive, so `go install pkg@version` refuses it; a
# throwaway module requires it and repeats that replace.
build_keda() {
  if up_to_date "${BIN}/keda/keda" "${KEDA_VERSION}" && up_to_date "${BIN}/keda/keda-adapter" "${KEDA_VERSION}"; then return; fi
  log "building KEDA ${KEDA_VERSION} (cold: many minutes)"
  local dir="${WORK}/keda-${KEDA_VERSION}"
  mkdir -p "${dir}" "${BIN}/keda"
  (
    cd "${dir}"
    local gomod
    gomod="$(go mod download -json "github.com/kedacore/keda/v2@${KEDA_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
    {
      printf 'module kedabuild\n\ngo 1.26\n\nrequire github.com/kedacore/keda/v2 %s\n\n' "${KEDA_VERSION}"
      grep -E '^replace ' "${gomod}" || true
    } >go.mod
    local x="-s -w -X github.com/kedacore/keda/v2/version.Version=${KEDA_VERSION#v} -X github.com/kedacore/keda/v2/version.GitCommit=${KEDA_VERSION}"
    go build -trimpath -ldflags "${x}" -o "${BIN}/keda/keda" github.com/kedacore/keda/v2/cmd/operator
    go build -trimpath -ldflags "${x}" -o "${BIN}/keda/keda-adapter" github.com/kedacore/keda/v2/cmd/adapter
  )
  stamp "${BIN}/keda/keda" "${KEDA_VERSION}"
  stamp "${BIN}/keda/keda-adapter" "${KEDA_VERSION}"
}

# Prometheus' Go module versions v0.MMM.P are its releases M.MM.P (v0.316.0 is 3.16.0).
build_prometheus() {
  local mp="${PROMETHEUS_VERSION#v0.}"
  local release="${mp:0:1}.${mp:1}"
  local x="-s -w -X github.com/prometheus/common/version.Version=${release} -X github.com/prometheus/common/version.Branch=release"
  go_install prometheus github.com/prometheus/prometheus/cmd/prometheus "${PROMETHEUS_VERSION}" "${PROMETHEUS_VERSION}" "${x}"
  go_install promtool github.com/prometheus/prometheus/cmd/promtool "${PROMETHEUS_VERSION}" "${PROMETHEUS_VERSION}" "${x}"
}

tools=("$@")
[[ ${#tools[@]} -gt 0 ]] || tools=(controller-gen etcd kube helm)
for t in "${tools[@]}"; do
  case "$t" in
    kube | kube-apiserver | kubectl) build_kube ;;
    etcd) build_etcd ;;
    controller-gen) build_controller_gen ;;
    helm) build_helm ;;
    node) build_node ;;
    coredns) build_coredns ;;
    nats-server) build_nats_server ;;
    keda) build_keda ;;
    prometheus) build_prometheus ;;
    *) echo "unknown tool: $t" >&2; exit 2 ;;
  esac
done
