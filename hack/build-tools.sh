#!/usr/bin/env bash
# Builds the pinned tools this project needs into bin/ from the Go module proxy:
# a real control plane for envtest (kube-apiserver, etcd), kubectl, controller-gen and helm.
# setup-envtest's download cannot reach its bucket from every machine, so we compile instead.
# Each tool is stamped with its version; a second run reuses what is already built.
#
# Usage: hack/build-tools.sh [tool ...]   (default: all)
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

build_kube() {
  local want="${KUBE_VERSION}+versioned"
  if up_to_date "${ASSETS}/kube-apiserver" "${want}" && up_to_date "${ASSETS}/kubectl" "${want}"; then
    return
  fi
  log "building kube-apiserver and kubectl ${KUBE_VERSION} (first time: several minutes)"
  local dir="${WORK}/kubernetes-${KUBE_VERSION}"
  mkdir -p "${dir}"
  (
    cd "${dir}"
    local gomod
    gomod="$(go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
    {
      echo "module kubebuild"
      echo
      echo "go 1.26"
      echo
      echo "require k8s.io/kubernetes ${KUBE_VERSION}"
      echo
      # Every staging repository that kubernetes replaces with ./staging/... is taken from the
      # proxy at the matching v0.x version instead.
      grep -E '^\s*k8s\.io/[^ ]+ => \./staging/' "${gomod}" | awk -v v="${STAGING_VERSION}" '{print "replace " $1 " => " $1 " " v}'
    } >go.mod
    cat >tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubectl/pkg/cmd"
)
GO
    go mod tidy >/dev/null 2>&1 || true
    go build -trimpath -ldflags "$(kube_ldflags)" -o "${ASSETS}/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
    go build -trimpath -ldflags "$(kube_ldflags)" -o "${ASSETS}/kubectl" k8s.io/kubernetes/cmd/kubectl
  )
  stamp "${ASSETS}/kube-apiserver" "${want}"
  stamp "${ASSETS}/kubectl" "${want}"
  ln -sf k8s/kubectl "${BIN}/kubectl"
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

tools=("$@")
[[ ${#tools[@]} -gt 0 ]] || tools=(controller-gen etcd kube helm)
for t in "${tools[@]}"; do
  case "$t" in
    kube | kube-apiserver | kubectl) build_kube ;;
    etcd) build_etcd ;;
    controller-gen) build_controller_gen ;;
    helm) build_helm ;;
    *) echo "unknown tool: $t" >&2; exit 2 ;;
  esac
done
